use super::super::test_op;
use super::*;
use crate::limiter::{CountedHolds, NamedHolds, Reservation};
use crate::store::redis::probe::NoScripts;

fn store(prefix: &str) -> RedisStore {
    RedisStore::for_tests(prefix)
}

fn op(algorithm: Algorithm, window_ms: u64) -> Op {
    test_op("dom_k_v_", algorithm, window_ms, 3)
}

fn text(p: &Packed) -> String {
    String::from_utf8(p.bytes().to_vec()).unwrap()
}

fn packed(c: &Cmd<'_>) -> Packed {
    let mut p = Packed::default();
    pack(c, &mut p);
    assert_eq!(p.len(), 1);
    p
}

/// The crate's own encoding of a command of these arguments.
fn reference(args: &[&[u8]]) -> String {
    let mut c = redis::Cmd::new();
    for a in args {
        c.arg(*a);
    }
    String::from_utf8(c.get_packed_command()).unwrap()
}

fn again(p: &Packed) -> Packed {
    let mut out = Packed::default();
    by_text(p, 0, &mut out);
    out
}

const NOW: u64 = 1_700_000_123_456_000_000;

#[test]
fn fixed_windows_keep_envoys_key_and_incrby() {
    let s = store("pre_");
    let o = op(Algorithm::FixedWindow, 60_000);
    let c = s.cmd(&o, NOW, false);
    assert_eq!(
        text(&packed(&c)),
        reference(&[b"INCRBY", b"pre_dom_k_v_1700000100", b"3"])
    );
    let sub = op(Algorithm::FixedWindow, 250);
    let c = s.cmd(&sub, NOW, false);
    assert_eq!(
        text(&packed(&c)),
        reference(&[b"INCRBY", b"pre_dom_k_v_1700000123250ms", b"3"])
    );
    assert_eq!(
        text(&packed(&s.cmd(&o, NOW, true))),
        reference(&[
            b"EVALSHA",
            REFUND_COUNT_SHA.as_bytes(),
            b"1",
            b"pre_dom_k_v_1700000100",
            b"3"
        ])
    );
}

#[test]
fn a_created_key_gets_one_window_of_ttl() {
    let s = store("");
    let o = op(Algorithm::FixedWindow, 1000);
    let c = s.cmd(&o, NOW, false);
    let sent = packed(&c);
    let mut e = Packed::default();
    c.then().follow_up(&sent, 0, &[4], 0, &mut e);
    assert!(e.is_empty());
    c.then().follow_up(&sent, 0, &[3], 0, &mut e);
    assert_eq!(
        text(&e),
        reference(&[b"PEXPIRE", b"dom_k_v_1700000123", b"1000"])
    );
    c.then().follow_up(&sent, 0, &[3], 5, &mut e);
    let ttl: u64 = std::str::from_utf8(e.args(1)[2]).unwrap().parse().unwrap();
    assert!((1000..6000).contains(&ttl), "{ttl}");
}

#[test]
fn scripts_go_by_sha_and_again_by_text() {
    let s = store("p:");
    let sliding = op(Algorithm::SlidingWindow, 1000);
    let c = packed(&s.cmd(&sliding, NOW, false));
    let want: [&[u8]; 11] = [
        b"EVALSHA",
        SLIDING_SHA.as_bytes(),
        b"2",
        b"p:{dom_k_v_}_1700000123",
        b"p:{dom_k_v_}_1700000122",
        b"10",
        b"3",
        b"544",
        b"1000",
        b"2000",
        b"0",
    ];
    assert_eq!(text(&c), reference(&want));
    let mut again_args = want;
    again_args[0] = b"EVAL";
    again_args[1] = SLIDING.as_bytes();
    assert_eq!(text(&again(&c)), reference(&again_args));
    let synced = packed(&s.sync_cmd(&sliding, NOW, NOW));
    assert!(text(&synced).ends_with("$1\r\n1\r\n"));

    let bucket = op(Algorithm::TokenBucket { burst: 4 }, 1000);
    let c = packed(&s.cmd(&bucket, NOW, false));
    assert_eq!(
        text(&c),
        reference(&[
            b"EVALSHA",
            GCRA_SHA.as_bytes(),
            b"1",
            b"p:{dom_k_v_}_tat",
            b"1700000123456000",
            b"100000",
            b"4",
            b"3"
        ])
    );
    for (cmd, src) in [
        (s.sync_cmd(&bucket, NOW, NOW), GCRA_ADD),
        (s.cmd(&bucket, NOW, true), REFUND_GCRA),
        (s.cmd(&bucket, NOW, false), GCRA),
        (s.cmd(&sliding, NOW, true), REFUND_COUNT),
    ] {
        let t = text(&again(&packed(&cmd)));
        assert!(t.contains(src), "{t}");
        assert!(t.starts_with("*"), "{t}");
    }
    let plain = packed(&Cmd::Get {
        key: s.key(&sliding, "", "", None),
    });
    assert_eq!(text(&again(&plain)), text(&plain));
    assert_eq!(text(&plain), reference(&[b"GET", b"p:dom_k_v_"]));
}

#[test]
fn names_print_as_they_are_sent() {
    let s = store("x_");
    let o = op(Algorithm::FixedWindow, 1000);
    let Cmd::Fixed { key, .. } = s.cmd(&o, NOW, false) else {
        panic!("fixed");
    };
    assert_eq!(key.to_string(), "x_dom_k_v_1700000123");
    let sub = op(Algorithm::FixedWindow, 250);
    let Cmd::Fixed { key, .. } = s.cmd(&sub, NOW, false) else {
        panic!("fixed");
    };
    assert_eq!(key.to_string(), "x_dom_k_v_1700000123250ms");
}

/// The arguments `c` is packed with, as text.
fn args(c: &Cmd<'_>) -> Vec<String> {
    (packed(c).args(0).iter())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect()
}

#[test]
fn holds_live_in_a_set_sharing_their_counters_cluster_slot() {
    let s = store("pre_");
    let check = |algorithm| Op {
        hits: 0,
        reserve: Reservation::Counted(CountedHolds::Hold {
            hits: 300,
            for_ms: 600_000,
            id: 7,
        }),
        ..op(algorithm, 86_400_000)
    };
    // A fixed window's set is named by its window's key, braced whole: the same slot.
    let fixed = check(Algorithm::FixedWindow);
    let a = args(&s.hold_cmd(&fixed, NOW, false).unwrap());
    assert_eq!(a[0..3], ["EVALSHA", &*holds::HOLD_SHA, "2"]);
    assert_eq!(
        a[3..5],
        ["{pre_dom_k_v_1699920000}_held", "pre_dom_k_v_1699920000"]
    );
    // Check (1), 300 a hold, limit 10, until now + 10 minutes, id 7.
    assert_eq!(
        a[5..13],
        [
            "1",
            "1700000123456000",
            "1",
            "300",
            "10",
            "0",
            "1700000723456000",
            "7"
        ]
    );
    // Sliding windows and token buckets: the counters' own hash tag.
    let sliding = check(Algorithm::SlidingWindow);
    let a = args(&s.hold_cmd(&sliding, NOW, false).unwrap());
    assert_eq!(
        a[2..6],
        [
            "3",
            "pre_{dom_k_v_}_held",
            "pre_{dom_k_v_}_1699920000",
            "pre_{dom_k_v_}_1699833600"
        ]
    );
    let bucket = check(Algorithm::TokenBucket { burst: 10 });
    let a = args(&s.hold_cmd(&bucket, NOW, false).unwrap());
    assert_eq!(a[2..5], ["2", "pre_{dom_k_v_}_held", "pre_{dom_k_v_}_tat"]);
    // Refunded: the hold by its id. A report: mode 2 with its hits.
    let a = args(&s.hold_cmd(&fixed, NOW, true).unwrap());
    assert_eq!(a, ["ZREM", "{pre_dom_k_v_1699920000}_held", "7"]);
    let report = Op {
        hits: 250,
        reserve: Reservation::Counted(CountedHolds::Release { hits: 300 }),
        ..op(Algorithm::FixedWindow, 86_400_000)
    };
    let a = args(&s.hold_cmd(&report, NOW, false).unwrap());
    assert_eq!(a[7..10], ["2", "300", "10"]);
    assert_eq!(a[10], "250");
    // Anything else goes as before.
    assert!(s
        .hold_cmd(&op(Algorithm::FixedWindow, 1000), NOW, false)
        .is_none());
}

#[test]
fn a_window_from_the_first_hit_goes_by_its_script_and_answers_its_ttl() {
    let s = store("pre_");
    let o = op(Algorithm::FromFirstHit, 60_000);
    // Counted beside the counter's named holds (mode 0), which expire by now (µs).
    assert_eq!(
        text(&packed(&s.cmd(&o, NOW, false))),
        reference(&[
            b"EVALSHA",
            FIRST_HIT_SHA.as_bytes(),
            b"2",
            b"pre_dom_k_v__first",
            b"{pre_dom_k_v__first}_held",
            b"3",
            b"60000",
            b"1700000123456000",
            b"0"
        ])
    );
    // A look-up reads the counter alone.
    assert_eq!(
        text(&packed(&first_hit_read("pre_", "dom_k_v_"))),
        reference(&[
            b"EVALSHA",
            FIRST_HIT_SHA.as_bytes(),
            b"1",
            b"pre_dom_k_v__first",
            b"0",
            b"1"
        ])
    );
    // A refund that leaves nothing deletes the key: no window.
    assert_eq!(
        text(&packed(&s.cmd(&o, NOW, true))),
        reference(&[
            b"EVALSHA",
            REFUND_COUNT_SHA.as_bytes(),
            b"1",
            b"pre_dom_k_v__first",
            b"3",
            b"1"
        ])
    );
    // The reply's TTL is the window's end, from when the op went.
    let asked = super::super::decode::Asked {
        params: o.params,
        hits: 3,
        refund: false,
        in_full: false,
        at: NOW - 5_000_000_000,
        sent: NOW,
        holds: None,
        reserve: Reservation::Named(NamedHolds::Beside),
    };
    let r = asked.decode(&[7, 42_000, 0, 0]);
    assert_eq!(
        r.before,
        crate::limiter::State::FromFirstHit {
            count: 4,
            end: NOW + 42_000_000_000
        }
    );
    // A read that found no key: no window.
    let read = asked.decode(&[0, -2, 0, 0]);
    assert_eq!(
        read.before,
        crate::limiter::State::FromFirstHit { count: 0, end: 0 }
    );
}

#[test]
fn named_holds_live_in_a_hash_beside_their_first_hit_counter() {
    let s = store("pre_");
    let reserve = Op {
        hits: 0,
        reserve: Reservation::Named(NamedHolds::Reserve {
            hits: 300,
            for_ms: 30_000,
            id: 7,
        }),
        ..op(Algorithm::FromFirstHit, 60_000)
    };
    // Mode 1: the hold's id, the limit, its hits, the longest it holds.
    let a = args(&s.cmd(&reserve, NOW, false));
    assert_eq!(a[0..3], ["EVALSHA", &*FIRST_HIT_SHA, "2"]);
    assert_eq!(
        a[3..],
        [
            "pre_dom_k_v__first",
            "{pre_dom_k_v__first}_held",
            "0",
            "60000",
            "1700000123456000",
            "1",
            "7",
            "10",
            "300",
            "30000"
        ]
    );
    // Refused on another counter: taken back by its id.
    let a = args(&s.cmd(&reserve, NOW, true));
    assert_eq!(a, ["HDEL", "{pre_dom_k_v__first}_held", "7"]);
    // A commit (mode 2) counts its usage in full and ends its hold by id.
    let commit = Op {
        hits: 250,
        reserve: Reservation::Named(NamedHolds::Commit { id: 7 }),
        counting: crate::limiter::Counting::Usage,
        ..op(Algorithm::FromFirstHit, 60_000)
    };
    let a = args(&s.sync_cmd(&commit, NOW, NOW));
    assert_eq!(a[5..], ["250", "60000", "1700000123456000", "2", "7"]);
    // A local-first replica's hits synced under a commit's op end nothing.
    let a = args(&s.sync_only_cmd(&commit, NOW, NOW));
    assert_eq!(a[5..], ["250", "60000", "1700000123456000", "0"]);
    // The reply: held beside the op, and whether it held or ended its hold.
    let asked = |reserve| super::super::decode::Asked {
        params: commit.params,
        hits: 0,
        refund: false,
        in_full: false,
        at: NOW,
        sent: NOW,
        holds: None,
        reserve,
    };
    let r = asked(reserve.reserve).decode(&[100, 30_000, 600, 1]);
    assert_eq!(
        (r.allowed, r.holds.named, r.holds.released),
        (Some(true), 600, false)
    );
    let r = asked(reserve.reserve).decode(&[100, 30_000, 900, 0]);
    assert_eq!(r.allowed, Some(false));
    let r = asked(commit.reserve).decode(&[350, 30_000, 600, 1]);
    assert_eq!(
        (r.allowed, r.holds.named, r.holds.released),
        (None, 600, true)
    );
    let r = asked(Reservation::Named(NamedHolds::Beside)).decode(&[350, 30_000, 600, 0]);
    assert_eq!(
        (r.allowed, r.holds.named, r.holds.released),
        (None, 600, false)
    );
}

/// The key each `redis.call` of `src` names (its first argument after the command), in order.
fn keys_called(src: &str) -> Vec<&str> {
    src.split("redis.call(")
        .skip(1)
        .map(|call| call.split([',', ')']).nth(1).unwrap_or("").trim())
        .collect()
}

/// Every script declares every key it touches (`KEYS[i]`, never a name built inside it): Redis
/// Cluster routes a script by its declared keys, and Dragonfly refuses undeclared ones.
#[test]
fn every_script_touches_only_the_keys_it_declares() {
    for src in ALL {
        let keys = keys_called(src);
        assert!(!keys.is_empty(), "{src}");
        for k in keys {
            assert!(k.starts_with("KEYS[") && k.ends_with(']'), "{k:?} in {src}");
        }
    }
}

/// A fixed window's refund on a store without scripts: `DECRBY`, and a `DEL` of a key it made.
#[test]
fn a_refund_without_scripts_decrements_and_deletes_a_key_it_made() {
    let mut s = store("p_");
    s.no_scripts.main = Some(NoScripts {
        setting: "REDIS_URL",
        store: "valkey 9.1.2".into(),
        answer: "ERR Could not find scripting engine 'lua'".into(),
    });
    let o = op(Algorithm::FixedWindow, 60_000);
    let c = s.cmd(&o, NOW, true);
    let sent = packed(&c);
    assert_eq!(
        text(&sent),
        reference(&[b"DECRBY", b"p_dom_k_v_1700000100", b"3"]),
        "{c:?}"
    );
    let mut after = Packed::default();
    c.then().follow_up(&sent, 0, &[1], 0, &mut after);
    assert!(after.is_empty(), "a key that was there stays");
    c.then().follow_up(&sent, 0, &[-3], 0, &mut after);
    assert_eq!(text(&after), reference(&[b"DEL", b"p_dom_k_v_1700000100"]));
    // With scripts, the refund stays the script floored at zero.
    let with = store("p_");
    assert!(matches!(with.cmd(&o, NOW, true), Cmd::RefundCount { .. }));
}
