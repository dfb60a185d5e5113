//! The store contract over a real Redis, below the shards: a sync that refunds more hits
//! than it took since the last one (a local-first view's net, or hits replayed after an outage
//! netting out refunds) takes them out of the window, as the contract says (`StoreOp::sync_at`
//! with `refund`).

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use turnstile::config::Algorithm;
use turnstile::limiter::key::Key;
use turnstile::limiter::{Counting, Op, Params, Role, State, Store, StoreOp, Tat};
use turnstile::settings::Settings;
use turnstile::store::redis::{RedisErrors, RedisStore, StartupRetries};

use crate::common::redis::Redis;

fn op(hits: u64) -> Op {
    Op {
        key: Key::new("sync_test_k_"),
        params: Params {
            requests_per_unit: 100,
            window_ms: 3_600_000,
            algorithm: Algorithm::FixedWindow,
            calendar: None,
            tat: Tat::Full,
        },
        hits,
        refund: false,
        counting: Counting::IfAdmitted,
        role: Role::Binding,
        queue: None,
        grant: None,
        local_first: Some(true),
        reserve: turnstile::limiter::Reservation::None,
    }
}

#[tokio::test]
async fn a_sync_that_gives_hits_back_takes_them_out_of_the_window() {
    let redis = Redis::start();
    let url = format!("127.0.0.1:{}", redis.port);
    let env = |k: &str| match k {
        "REDIS_URL" => Some(url.clone()),
        "REDIS_STARTUP_INITIAL_INTERVAL" => Some("50ms".into()),
        _ => None,
    };
    let settings = Settings::from_env(env).unwrap();
    let settings = settings.storage.redis().cloned().expect("Redis settings");
    let (retries, errors) = (StartupRetries::default(), Arc::new(RedisErrors::new(1)));
    let store = RedisStore::connect(&settings, &retries, &errors)
        .await
        .expect("Redis answers");
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    let deadline = Duration::from_secs(2);
    let sync = |op: &Op, refund: bool| {
        let batch = [StoreOp {
            op,
            refund,
            sync_at: Some(now),
            in_full: false,
        }];
        store.run(0, &batch, now, deadline)
    };
    let count = |state: State| match state {
        State::Fixed { count, .. } => count,
        other => panic!("a fixed window's state, not {other:?}"),
    };
    // Five admitted locally, synced; then a net of two refunded, synced.
    sync(&op(5), false).await.expect("the first sync");
    sync(&op(2), true).await.expect("the second sync");
    let peeked = store.peek(0, &op(0), now, deadline).await.expect("a read");
    assert_eq!(count(peeked[0].before), 3, "5 taken, 2 refunded");
}
