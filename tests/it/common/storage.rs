//! One scenario, every storage: `test_with_every_storage!` makes each scenario function (async,
//! taking a `&Storage`) one test per storage, each under its own name (`scenario::memory`,
//! `scenario::durable`, `scenario::redis`, `scenario::local_first`), so a failure names both the
//! scenario and the storage.

use std::sync::atomic::{AtomicUsize, Ordering};

use super::redis::{self, Redis};
use super::tempdir::TempDir;
use super::TestServer;

/// Where the servers a scenario starts keep their counters.
pub enum Storage {
    Memory,
    /// Memory with the durable counters on (`TURNSTILE_STATE_DIR`), each server in a directory
    /// of its own under this one; removed when the storage is dropped.
    Durable(TempDir),
    /// A redis-server of the test's own, on a free port; stopped when the storage is dropped.
    Redis(Redis),
    /// The same, with `TURNSTILE_LOCAL_FIRST=true`: one replica alone decides as in memory.
    LocalFirst(Redis),
}

static PREFIXES: AtomicUsize = AtomicUsize::new(0);

impl Storage {
    pub fn memory() -> Storage {
        Storage::Memory
    }

    pub fn durable() -> Storage {
        Storage::Durable(TempDir::new("durable-storage"))
    }

    pub fn redis() -> Storage {
        Storage::Redis(Redis::start())
    }

    pub fn local_first() -> Storage {
        Storage::LocalFirst(Redis::start())
    }

    /// The real server on port 0 with a manual clock, counting on this storage.
    pub async fn start(&self, yaml: &str) -> TestServer {
        self.start_with(yaml, &[]).await
    }

    /// As [`Storage::start`], with `env` as the process environment would be. On Redis each
    /// server gets a key prefix of its own, so two servers of one scenario count apart, as two
    /// in-memory servers do.
    pub async fn start_with(&self, yaml: &str, env: &[(&str, &str)]) -> TestServer {
        TestServer::start_env(yaml, self.env(env)).await
    }

    /// As [`Storage::start_with`], the limits read from where `env` says (`RUNTIME_*`) and
    /// reloaded from there (`running().reload_config()`).
    pub async fn start_from_env(&self, env: &[(&str, &str)]) -> TestServer {
        TestServer::start_from_env_owned(self.env(env)).await
    }

    /// `env`, then this storage's settings. The first of two equal names wins: the scenario's
    /// own settings come first.
    fn env(&self, env: &[(&str, &str)]) -> Vec<(String, String)> {
        let mut all: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        if let Storage::Redis(r) | Storage::LocalFirst(r) = self {
            let n = PREFIXES.fetch_add(1, Ordering::Relaxed);
            all.extend(redis::env(r, &format!("s{n}_")));
        }
        if let Storage::LocalFirst(_) = self {
            all.push(("TURNSTILE_LOCAL_FIRST".into(), "true".into()));
        }
        if let Storage::Durable(dir) = self {
            let n = PREFIXES.fetch_add(1, Ordering::Relaxed);
            let state = dir.path().join(format!("s{n}"));
            all.push(("TURNSTILE_STATE_DIR".into(), state.display().to_string()));
        }
        all
    }
}

/// `test_with_every_storage!(a, b)` after `async fn a(storage: &Storage)` and `async fn b(..)`
/// gives the tests `a::memory`, `a::durable`, `a::redis`, `a::local_first`, `b::memory` and so on. (A module and a function
/// may share a name: they live in different namespaces.) A scenario behaves the same on every
/// storage; a difference is a bug to fix, not a test to skip.
macro_rules! test_with_every_storage {
    ($($scenario:ident),+ $(,)?) => {$(
        mod $scenario {
            use $crate::common::storage::Storage;

            #[tokio::test]
            async fn memory() {
                super::$scenario(&Storage::memory()).await;
            }

            #[tokio::test]
            async fn durable() {
                super::$scenario(&Storage::durable()).await;
            }

            #[tokio::test]
            async fn redis() {
                super::$scenario(&Storage::redis()).await;
            }

            #[tokio::test]
            async fn local_first() {
                super::$scenario(&Storage::local_first()).await;
            }
        }
    )+};
}
pub(crate) use test_with_every_storage;
