//! What a `Reserve`'s caller may rely on: answered OK, it holds what it asked for (a `ttl` that
//! could hold for no time holds as an unset one does, for `--max-reservation-ttl`, as Limitador
//! holds a negative one: its `Duration::try_from` fails and it passes none; flags that would
//! make every hold hold nothing stop the start); its id cannot be guessed from another's (the
//! wasm-shim treats ids as opaque strings).

use turnstile::transport::limitador::pb::{ReserveRequest, ReserveResponse};

use super::redis::refused;
use super::reserve::{code_of, reserve_req, should, RESERVE, TOKENS};
use super::*;

#[tokio::test]
async fn a_ttl_of_no_time_holds_as_an_unset_one() {
    let l = Limitador::start(&[], TOKENS);
    let ttl = |seconds, nanos| Some(prost_types::Duration { seconds, nanos });
    let ttls = [
        ("zero", ttl(0, 0)),
        ("negative", ttl(-5, 0)),
        ("min", ttl(i64::MIN, 0)),
        ("nanosecond", ttl(0, 1)),
        ("unset", None),
    ];
    for (user, ttl) in ttls {
        let req = ReserveRequest {
            ttl,
            ..reserve_req(user, 500, None)
        };
        let r: ReserveResponse = call(&l.grpc(), RESERVE, req).await.unwrap();
        assert_eq!(code_of(&r), "OK", "{user}");
        assert!(!r.reservation_id.is_empty(), "{user}");
        // 500 held of 1 000: 501 more do not fit, 500 do.
        assert_eq!(should(&l, user, 501).await, "OVER_LIMIT", "ttl {user}");
        assert_eq!(should(&l, user, 500).await, "OK", "ttl {user}");
    }
}

#[test]
fn flags_that_would_hold_nothing_stop_the_start() {
    for flags in [
        ["--max-reservation-ttl", "0"],
        ["--max-reservation-ttl", "500us"],
        ["--max-reservation-fraction", "0"],
    ] {
        let err = refused(&flags, &[]);
        assert!(
            err.contains(flags[0]) && err.contains("holding nothing"),
            "{flags:?}: {err}"
        );
    }
}

#[tokio::test]
async fn reservation_ids_cannot_be_guessed_from_one_another() {
    let l = Limitador::start(&[], TOKENS);
    let mut ids = Vec::new();
    for n in 0..20 {
        let r: ReserveResponse = call(&l.grpc(), RESERVE, reserve_req(&format!("u{n}"), 1, None))
            .await
            .unwrap();
        assert_eq!(code_of(&r), "OK");
        ids.push(r.reservation_id.parse::<u64>().expect("a decimal id"));
    }
    ids.sort_unstable();
    let near = ids.windows(2).filter(|w| w[1] - w[0] < 1 << 32).count();
    assert_eq!(near, 0, "ids close to one another: {ids:?}");
}

/// A counter whose `max_value × --max-reservation-fraction` is below 1 still holds what a
/// `Reserve` answered OK says (one hit), and a `max_value` of 0 refuses it, as every call.
#[tokio::test]
async fn a_small_counter_holds_one_hit_or_refuses() {
    let small = "- namespace: ns/llm\n  max_value: 1\n  seconds: 60\n  conditions: []\n  variables: []\n\
                 - namespace: zero\n  max_value: 0\n  seconds: 60\n  conditions: []\n  variables: []\n";
    let l = Limitador::start(&[], small);
    let r: ReserveResponse = call(&l.grpc(), RESERVE, reserve_req("u", 5, None))
        .await
        .unwrap();
    assert_eq!(code_of(&r), "OK");
    assert_eq!(
        should(&l, "u", 1).await,
        "OVER_LIMIT",
        "the one hit is held"
    );
    let zero = ReserveRequest {
        domain: "zero".into(),
        ..reserve_req("u", 5, None)
    };
    let r: ReserveResponse = call(&l.grpc(), RESERVE, zero).await.unwrap();
    assert_eq!(code_of(&r), "OVER_LIMIT");
}
