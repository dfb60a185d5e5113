//! `datastore_partitioned`: 1 while the store cannot be reached, 0 again once it can, as
//! Limitador's `redis_cached` flips it on a flush that fails and back on one that goes through
//! (limitador/src/storage/redis/redis_cached.rs, `flip_partitioned`).

use super::*;
use crate::common::binary::{block_on, http_get, wait_for};
use crate::common::redis::Redis;

/// The gauge's line, after one call (the calls keep the flushes going).
fn partitioned(l: &Limitador, user: &str) -> String {
    let _ = block_on(unary(&l.grpc(), SHOULD_RATE_LIMIT, toystore(user)));
    let metrics = http_get(l.server.ports.http, "/metrics");
    (metrics.lines())
        .find(|line| line.starts_with("datastore_partitioned "))
        .unwrap_or("no datastore_partitioned")
        .to_owned()
}

#[test]
fn datastore_partitioned_says_when_redis_cannot_be_reached() {
    let mut r = Redis::start();
    let url = format!("redis://127.0.0.1:{}", r.port);
    let storage = ["redis_cached", url.as_str(), "--flush-period", "200"];
    let l = Limitador::start_on(&[], LIMITS, &storage, &[]);
    assert_eq!(partitioned(&l, "alice"), "datastore_partitioned 0");
    r.kill();
    let mut n = 0;
    wait_for("datastore_partitioned 1", || {
        n += 1;
        let line = partitioned(&l, &format!("u{n}"));
        (line != "datastore_partitioned 1").then_some(line)
    });
    r.restart();
    wait_for("datastore_partitioned 0", || {
        n += 1;
        let line = partitioned(&l, &format!("u{n}"));
        (line != "datastore_partitioned 0").then_some(line)
    });
}
