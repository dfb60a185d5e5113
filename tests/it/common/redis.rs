//! Real Redis servers for tests: started on free ports, stopped on drop. The program is
//! `redis-server`, or the one `TURNSTILE_TEST_REDIS_SERVER` names (`scripts/test.sh` runs the
//! Redis-backed tests a second time with `valkey-server`).

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::tempdir::TempDir;

/// The server program the Redis-backed tests start (and their Sentinels, `--sentinel`).
pub fn server_program() -> String {
    std::env::var("TURNSTILE_TEST_REDIS_SERVER").unwrap_or_else(|_| "redis-server".to_owned())
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Runs `redis-cli` against `port` and returns its output.
pub fn cli(port: u16, args: &[&str]) -> String {
    cli_auth(port, None, args)
}

pub fn cli_auth(port: u16, auth: Option<&str>, args: &[&str]) -> String {
    let mut cmd = Command::new("redis-cli");
    cmd.args(["-p", &port.to_string()]);
    if let Some(a) = auth {
        cmd.args(["-a", a, "--no-auth-warning"]);
    }
    let out = cmd
        .args(args)
        .output()
        .expect("redis-cli is on PATH (scripts/install-test-deps.sh installs it)");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

pub struct Redis {
    pub port: u16,
    child: Option<Child>,
    /// Its working directory (and room for files a test puts beside it).
    pub dir: TempDir,
    extra: Vec<String>,
    auth: Option<String>,
    /// `redis-server`, `valkey-server`, ... (see [`server_program`]).
    program: String,
}

impl Redis {
    pub fn start() -> Redis {
        Self::start_with(&[])
    }

    pub fn start_with(extra: &[&str]) -> Redis {
        Self::start_program(&server_program(), extra)
    }

    /// A Valkey that runs no scripts: its Lua engine, a module since Valkey 9.1, unloaded
    /// (`EVAL` answers `ERR Could not find scripting engine 'lua'`).
    pub fn valkey_without_lua() -> Redis {
        let v = Redis::start_program("valkey-server", &["--enable-module-command", "yes"]);
        assert_eq!(v.cli(&["MODULE", "UNLOAD", "lua"]), "OK");
        let refused = v.cli(&["EVAL", "return 1", "0"]);
        assert!(refused.contains("scripting engine"), "{refused}");
        v
    }

    /// `program` (`valkey-server`, say, whichever the tests run) with `extra` arguments.
    pub fn start_program(program: &str, extra: &[&str]) -> Redis {
        let dir = TempDir::new("redis");
        let mut r = Redis {
            port: free_port(),
            child: None,
            auth: extra
                .iter()
                .position(|a| *a == "--requirepass")
                .and_then(|i| extra.get(i + 1))
                .map(|s| s.to_string()),
            dir,
            extra: extra.iter().map(|s| s.to_string()).collect(),
            program: program.to_owned(),
        };
        r.spawn(false);
        r
    }

    /// Starts redis-server and waits until it answers. The port was free when picked, but a
    /// parallel test may pick it too: the server that answers must be our own child (its
    /// `process_id`), or we try again, on another port unless `same_port` (a restart: the
    /// server under test knows this port, so another would fail the test for the wrong reason).
    fn spawn(&mut self, same_port: bool) {
        for _ in 0..5 {
            let mut child = Command::new(&self.program)
                .args([
                    "--port",
                    &self.port.to_string(),
                    "--bind",
                    "127.0.0.1",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                ])
                .arg("--dir")
                .arg(self.dir.path())
                .args(&self.extra)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap_or_else(|e| {
                    let p = &self.program;
                    panic!("{p} is on PATH (scripts/install-test-deps.sh installs it): {e}")
                });
            let pid = format!("process_id:{}", child.id());
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                if let Ok(Some(_)) = child.try_wait() {
                    break; // it exited: the port was taken
                }
                let info = cli_auth(self.port, self.auth.as_deref(), &["INFO", "server"]);
                if info.contains(&pid) {
                    self.child = Some(child);
                    return;
                }
                assert!(
                    Instant::now() < deadline,
                    "{} on {} did not start",
                    self.program,
                    self.port
                );
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.wait();
            if same_port {
                std::thread::sleep(Duration::from_millis(200));
            } else {
                self.port = free_port();
            }
        }
        panic!("could not start {} on port {}", self.program, self.port);
    }

    pub fn url(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Kills the server (as a crash would).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Stalls the server (SIGSTOP): connections stay open, nothing is answered, and what was
    /// sent meanwhile is read when it resumes.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Resumes a paused server (SIGCONT).
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, sig: &str) {
        let pid = self.child.as_ref().expect("running").id().to_string();
        let ok = Command::new("kill").args([sig, &pid]).status().unwrap();
        assert!(ok.success(), "kill {sig} {pid}");
    }

    /// Starts it again on the same port, with what its directory holds (nothing, unless a
    /// test saved it there: `SAVE` writes `dump.rdb`, read at start).
    pub fn restart(&mut self) {
        self.kill();
        self.spawn(true);
    }

    pub fn cli(&self, args: &[&str]) -> String {
        cli_auth(self.port, self.auth.as_deref(), args)
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Environment for a turnstile using `redis` (single), with its own key prefix.
pub fn env(redis: &Redis, prefix: &str) -> Vec<(String, String)> {
    vec![
        ("BACKEND_TYPE".into(), "redis".into()),
        ("REDIS_URL".into(), redis.url()),
        ("CACHE_KEY_PREFIX".into(), prefix.into()),
        ("EXPIRATION_JITTER_MAX_SECONDS".into(), "0".into()),
        // Tests run beside builds on a small machine: a roomy deadline keeps the breaker shut.
        ("TURNSTILE_REDIS_DEADLINE_MS".into(), "2000".into()),
    ]
}
