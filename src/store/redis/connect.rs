//! Connections to a deployment (single, Sentinel, Cluster; TCP, TLS or a unix socket) and the
//! pipelines sent over them.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
use redis::cluster_async::ClusterConnection;
use redis::sentinel::{SentinelClient, SentinelServerType};
use redis::{Pipeline, Value};
use tokio::sync::Mutex;

use super::connect_error::{is_auth, ConnectError, Password};
use super::decode::{ints, Ints};
use super::packed::Packed;
use super::plain::{Plain, RespReply, Target};
use super::scripts::by_text;
use super::{RedisErrors, RedisSettings, RedisStore, RedisTarget, RedisType};

/// Which password a Sentinel deployment's refusal is about: the crate asks the Sentinels and
/// then the master in one call, so each Sentinel is asked alone (`PING`, with the Sentinels'
/// password): one that refuses it means `<prefix>SENTINEL_AUTH`, else the master refused
/// `<prefix>AUTH`.
async fn refused_password(t: &RedisTarget, prefix: &str, within: Duration) -> String {
    let sentinels = t.url.split(',').skip(1).map(str::trim);
    for host in sentinels {
        let Ok(info) = sentinel_info(host, t.sentinel_auth.as_deref()) else {
            continue;
        };
        let asked = async {
            let client = redis::Client::open(info)?;
            let mut c = client.get_multiplexed_async_connection().await?;
            redis::cmd("PING").query_async::<Value>(&mut c).await
        };
        match tokio::time::timeout(within, asked).await {
            Ok(Err(e)) if is_auth(&e) => {
                let given = if t.sentinel_auth.is_some() {
                    "refused"
                } else {
                    "not set"
                };
                return format!("the Sentinel at {host}: {prefix}SENTINEL_AUTH {given}");
            }
            Ok(Ok(_)) => break,
            _ => {}
        }
    }
    let given = if t.auth.is_some() {
        "refused"
    } else {
        "not set"
    };
    format!("the master: {prefix}AUTH {given}")
}

/// A connection to one deployment, reconnecting by itself.
#[derive(Clone)]
pub(super) enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
    /// Sentinel: asks the sentinels for the master again after a failure.
    Sentinel(Arc<Mutex<SentinelMaster>>),
    /// A single Redis without TLS, on a shard's round trips (see `plain`).
    Plain(Arc<Plain>),
}

/// A Sentinel deployment's client, and the connection to the master it gave (`None`: ask the
/// sentinels again), locked together.
pub(super) struct SentinelMaster {
    client: SentinelClient,
    conn: Option<MultiplexedConnection>,
}

/// The connections of one deployment.
pub(super) struct Deployment {
    /// Made at start through the crate (and PINGed there); Cluster and Sentinel send through
    /// them, and so do RLQS exchanges.
    pub(super) conns: Vec<Conn>,
    /// A single Redis: one connection per pool slot, made by the first shard that uses the
    /// slot, on that shard's worker thread, so its reads and writes run beside the shard
    /// instead of waking the thread that started the process for every round trip.
    pub(super) home: Option<Home>,
}

pub(super) struct Home {
    client: redis::Client,
    config: ConnectionManagerConfig,
    /// Plain TCP or a unix socket: the slots connect without the multiplexer (see `plain`).
    plain: Option<Target>,
    slots: Box<[OnceLock<Conn>]>,
}

impl Deployment {
    /// The connection `lane` (a shard's index) sends through.
    pub(super) fn conn(&self, lane: usize) -> Conn {
        let n = self.conns.len();
        match &self.home {
            Some(h) => {
                let slot = &h.slots[lane % h.slots.len()];
                let c = slot.get_or_init(|| {
                    if let Some(t) = &h.plain {
                        return Conn::Plain(Arc::new(Plain::new(t.clone())));
                    }
                    match ConnectionManager::new_lazy_with_config(
                        h.client.clone(),
                        h.config.clone(),
                    ) {
                        Ok(m) => Conn::Single(m),
                        Err(_) => self.conns[lane % n].clone(),
                    }
                });
                c.clone()
            }
            None => self.conns[lane % n].clone(),
        }
    }
}

fn url_of(t: &RedisTarget, host: &str) -> String {
    // The crate percent-decodes what it reads back: a password holding `@`, `/` or `?` stays
    // whole.
    let e = encoded;
    if t.socket_unix {
        // Unix socket URLs carry credentials as query parameters.
        let auth = match &t.auth {
            None => String::new(),
            Some(a) => match a.split_once(':') {
                Some((u, p)) => format!("?user={}&pass={}", e(u), e(p)),
                None => format!("?pass={}", e(a)),
            },
        };
        return format!("unix://{host}{auth}");
    }
    let scheme = if t.tls { "rediss" } else { "redis" };
    let auth = match &t.auth {
        None => String::new(),
        // `user:password` for ACL users, a bare password otherwise.
        Some(a) => match a.split_once(':') {
            Some((u, p)) => format!("{}:{}@", e(u), e(p)),
            None => format!(":{}@", e(a)),
        },
    };
    format!("{scheme}://{auth}{host}")
}

/// `s` with every byte but URL's unreserved ones percent-encoded.
fn encoded(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// `user:password` for an ACL user, a bare password otherwise.
fn credentials(auth: &str) -> redis::RedisConnectionInfo {
    let (user, pass) = match auth.split_once(':') {
        Some((u, p)) => (Some(u), p),
        None => (None, auth),
    };
    let info = redis::RedisConnectionInfo::default().set_password(pass);
    match user {
        Some(u) => info.set_username(u),
        None => info,
    }
}

/// A Sentinel's address, with the Sentinels' own password when they have one.
fn sentinel_info(host: &str, auth: Option<&str>) -> Result<redis::ConnectionInfo, String> {
    use redis::IntoConnectionInfo;
    let info = format!("redis://{host}")
        .into_connection_info()
        .map_err(|e| format!("REDIS_URL (sentinel {host}): {e}"))?;
    Ok(match auth {
        Some(a) => info.set_redis_settings(credentials(a)),
        None => info,
    })
}

/// The CA and client certificate files, read now so a wrong path stops the start.
fn certificates(t: &RedisTarget) -> Result<Option<redis::TlsCertificates>, String> {
    if !t.tls || (t.tls_ca.is_none() && t.tls_client.is_none()) {
        return Ok(None);
    }
    let read = |p: &str| std::fs::read(p).map_err(|e| format!("cannot read {p}: {e}"));
    Ok(Some(redis::TlsCertificates {
        client_tls: match &t.tls_client {
            Some(c) => Some(redis::ClientTlsConfig {
                client_cert: read(&c.cert)?,
                client_key: read(&c.key)?,
            }),
            None => None,
        },
        root_cert: t.tls_ca.as_deref().map(read).transpose()?,
    }))
}

/// A single Redis: one connection to check the address and password now; the shards make
/// theirs (see [`Home`]).
async fn single(
    t: &RedisTarget,
    certs: Option<redis::TlsCertificates>,
    deadline: Duration,
    pw: Option<Password>,
) -> Result<(Conn, Home), ConnectError> {
    let url = url_of(t, &t.url);
    let client = match certs {
        Some(c) => redis::Client::build_with_tls(url, c),
        None => redis::Client::open(url),
    }
    .map_err(|e| format!("REDIS_URL: {e}"))?;
    let cfg = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(deadline.max(Duration::from_millis(500))))
        .set_response_timeout(Some(deadline))
        .set_number_of_retries(1);
    let m = ConnectionManager::new_with_config(client.clone(), cfg.clone())
        .await
        .map_err(|e| {
            let what = format!("cannot connect to Redis at {}", t.url);
            ConnectError::of(&e, what, pw)
        })?;
    let connect_timeout = deadline.max(Duration::from_millis(500));
    let home = Home {
        plain: Target::of(&client, connect_timeout),
        client,
        config: cfg,
        slots: (0..t.pool_size.max(1)).map(|_| OnceLock::new()).collect(),
    };
    Ok((Conn::Single(m), home))
}

async fn connect(
    t: &RedisTarget,
    deadline: Duration,
    pw: Option<Password>,
) -> Result<Deployment, ConnectError> {
    let mut conns = Vec::with_capacity(t.pool_size);
    let mut home = None;
    let certs = certificates(t)?;
    match t.kind {
        RedisType::Single => {
            let (first, h) = single(t, certs, deadline, pw).await?;
            conns.push(first);
            home = Some(h);
        }
        RedisType::Cluster => {
            let nodes: Vec<String> = t.url.split(',').map(|h| url_of(t, h.trim())).collect();
            let mut builder = redis::cluster::ClusterClient::builder(nodes)
                .connection_timeout(deadline.max(Duration::from_millis(500)))
                .response_timeout(deadline);
            if let Some(c) = certs {
                builder = builder.certs(c);
            }
            let client = builder
                .build()
                .map_err(|e| format!("REDIS_URL (cluster): {e}"))?;
            let c = client.get_async_connection().await.map_err(|e| {
                ConnectError::of(
                    &e,
                    format!("cannot connect to the Redis Cluster at {}", t.url),
                    pw,
                )
            })?;
            // One cluster connection multiplexes over a connection per node.
            conns.push(Conn::Cluster(c));
        }
        RedisType::Sentinel => {
            // envoyproxy/ratelimit's form: `master-name,sentinel1:26379,sentinel2:26379`.
            let mut parts = t.url.split(',').map(str::trim);
            let master = parts.next().unwrap_or_default().to_owned();
            let sentinels = parts
                .map(|h| sentinel_info(h, t.sentinel_auth.as_deref()))
                .collect::<Result<Vec<_>, String>>()?;
            if master.is_empty() || sentinels.is_empty() {
                return Err(
                    "REDIS_URL for sentinel must be master-name,host:port[,host:port...]"
                        .to_owned()
                        .into(),
                );
            }
            let mut node = redis::sentinel::SentinelNodeConnectionInfo::default();
            if let Some(a) = &t.auth {
                node = node.set_redis_connection_info(credentials(a));
            }
            for _ in 0..t.pool_size {
                let client = SentinelClient::build(
                    sentinels.clone(),
                    master.clone(),
                    Some(node.clone()),
                    SentinelServerType::Master,
                )
                .map_err(|e| format!("REDIS_URL (sentinel): {e}"))?;
                let master = SentinelMaster { client, conn: None };
                conns.push(Conn::Sentinel(Arc::new(Mutex::new(master))));
            }
        }
    }
    Ok(Deployment { conns, home })
}

impl RedisStore {
    /// Connects and checks every deployment with a PING, so a wrong address or password is
    /// known at start instead of sending every decision to the fallback (`startup` retries
    /// what may pass).
    pub(super) async fn connect_once(
        s: &RedisSettings,
        errors: &Arc<RedisErrors>,
    ) -> Result<RedisStore, ConnectError> {
        let deadline = s.policy.deadline;
        let main = connect(&s.main, deadline, Password::of(&s.main, false)).await?;
        let per_second = match &s.per_second {
            Some(t) => Some(connect(t, deadline, Password::of(t, true)).await?),
            None => None,
        };
        let check = Duration::from_secs(5).max(deadline);
        for (name, prefix, target, dep) in [
            ("REDIS_URL", "REDIS_", &s.main, Some(&main)),
            (
                "REDIS_PERSECOND_URL",
                "REDIS_PERSECOND_",
                s.per_second.as_ref().unwrap_or(&s.main),
                per_second.as_ref(),
            ),
        ] {
            let Some(dep) = dep else { continue };
            for c in &dep.conns {
                let mut pipe = redis::pipe();
                pipe.cmd("PING");
                let ping = ping(c.clone(), pipe);
                match tokio::time::timeout(check, ping).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => {
                        let mut what = format!("Redis at {name} does not answer PING");
                        if target.kind == RedisType::Sentinel && is_auth(&e) {
                            let refused = refused_password(target, prefix, check).await;
                            what.push_str(&format!(" ({refused})"));
                        }
                        let pw = Password::of(target, name == "REDIS_PERSECOND_URL");
                        return Err(ConnectError::of(&e, what, pw));
                    }
                    Err(_) => {
                        return Err(ConnectError::Unreachable(format!(
                            "Redis at {name} does not answer PING within {check:?}"
                        )))
                    }
                }
            }
        }
        Ok(RedisStore {
            main,
            per_second,
            prefix: s.prefix.clone(),
            jitter_max_secs: s.jitter_max_secs,
            fleet_deadline: deadline.max(Duration::from_secs(1)),
            errors: errors.clone(),
            // Asked next (`probe`).
            no_scripts: Default::default(),
        })
    }
}

/// Sends `cmds` over `conn`; answers each command's reply as integers, in order. Scripts go by
/// their SHA1; those Redis does not know (`NOSCRIPT`: it restarted, or never saw them) are sent
/// again with their text. A command answered `NOSCRIPT` did not run, so sending it again counts
/// nothing twice; but it runs after whatever the shard sent meanwhile (two round trips may be
/// out). That can only make a count read meanwhile too high (a give-back that came late), or
/// leave a script to judge on a newer count, which it does atomically: it may refuse more than
/// needed, once, never admit more.
pub(super) async fn exec(conn: &Conn, cmds: &Packed) -> Result<Vec<Ints>, String> {
    let mut replies = send(conn, cmds).await?;
    let unknown: Vec<usize> = (0..replies.len())
        .filter(|&i| is_noscript(&replies[i]))
        .collect();
    if !unknown.is_empty() {
        let mut again = Packed::with_capacity(unknown.len());
        for &i in &unknown {
            by_text(cmds, i, &mut again);
        }
        for (i, r) in unknown.into_iter().zip(send(conn, &again).await?) {
            replies[i] = r;
        }
    }
    replies
        .into_iter()
        .map(|r| match r {
            RespReply::Ints(i) => Ok(i),
            RespReply::Error(e) => Err(format!("Redis answered an error: {e}")),
        })
        .collect()
}

fn is_noscript(r: &RespReply) -> bool {
    matches!(r, RespReply::Error(e) if e.split(' ').next() == Some("NOSCRIPT"))
}

/// A reply the crate read, as a [`RespReply`].
fn reply(v: Value) -> RespReply {
    match v {
        Value::ServerError(e) => RespReply::Error(match e.details() {
            Some(d) => format!("{} {d}", e.code()),
            None => e.code().to_owned(),
        }),
        v => RespReply::Ints(ints(v)),
    }
}

/// Sends `cmds` as one pipeline, or command by command on a Cluster; a command's error comes
/// back as its reply.
async fn send(conn: &Conn, cmds: &Packed) -> Result<Vec<RespReply>, String> {
    match conn {
        Conn::Plain(d) => d.round_trip(cmds.bytes().to_vec(), cmds.len()).await,
        // Boxed: the crate's futures would make every round trip's future as large as theirs.
        _ => Box::pin(through_crate(conn, cmds)).await,
    }
}

/// [`send`] over a connection made through the crate.
async fn through_crate(conn: &Conn, cmds: &Packed) -> Result<Vec<RespReply>, String> {
    let values: Vec<Value> = match conn {
        Conn::Plain(_) => unreachable!("a plain connection sends by itself"),
        Conn::Single(m) => {
            let mut m = m.clone();
            (cmds.pipeline().query_async(&mut m).await).map_err(|e| e.to_string())?
        }
        Conn::Sentinel(s) => {
            let mut guard = s.lock().await;
            if guard.conn.is_none() {
                let c = guard
                    .client
                    .get_async_connection()
                    .await
                    .map_err(|e| e.to_string())?;
                guard.conn = Some(c);
            }
            let mut c = guard.conn.clone().expect("connected");
            drop(guard);
            match cmds.pipeline().query_async(&mut c).await {
                Ok(v) => v,
                Err(e) => {
                    // The master may have moved: ask the sentinels again next time.
                    s.lock().await.conn = None;
                    return Err(e.to_string());
                }
            }
        }
        Conn::Cluster(c) => {
            // A pipeline must stay within one slot: each command (its keys share a hash tag
            // or are one key) goes on its own, all at once.
            let futs = (0..cmds.len()).map(|i| {
                let mut c = c.clone();
                let one = cmds.pipeline_of(i..i + 1);
                async move { one.query_async::<Vec<Value>>(&mut c).await }
            });
            let mut out = Vec::with_capacity(cmds.len());
            for r in futures_util::future::join_all(futs).await {
                let mut v = r.map_err(|e| e.to_string())?;
                out.push(v.pop().unwrap_or(Value::Nil));
            }
            out
        }
    };
    if values.len() != cmds.len() {
        return Err(format!(
            "Redis answered {} replies to {} commands",
            values.len(),
            cmds.len()
        ));
    }
    Ok(values.into_iter().map(reply).collect())
}

/// Sends one pipeline whose keys share one slot over `conn` (one of a deployment's `conns`, made
/// through the crate); answers the raw replies.
pub(super) async fn query(conn: Conn, pipe: Pipeline) -> Result<Vec<Value>, String> {
    match conn {
        Conn::Plain(_) => Err("a plain connection answers integers only".into()),
        Conn::Single(mut m) => pipe.query_async(&mut m).await.map_err(|e| e.to_string()),
        Conn::Cluster(mut c) => pipe.query_async(&mut c).await.map_err(|e| e.to_string()),
        Conn::Sentinel(s) => {
            let mut g = s.lock().await;
            if g.conn.is_none() {
                g.conn = Some(
                    g.client
                        .get_async_connection()
                        .await
                        .map_err(|e| e.to_string())?,
                );
            }
            let mut c = g.conn.clone().expect("connected");
            drop(g);
            let r = pipe.query_async(&mut c).await;
            if r.is_err() {
                // The master may have moved: ask the sentinels again next time.
                s.lock().await.conn = None;
            }
            r.map_err(|e| e.to_string())
        }
    }
}

async fn ping(conn: Conn, pipe: Pipeline) -> Result<(), redis::RedisError> {
    let r: Result<Vec<Value>, redis::RedisError> = match conn {
        Conn::Plain(_) => {
            let why = "a plain connection is not checked with PING";
            return Err((redis::ErrorKind::Client, why).into());
        }
        Conn::Single(mut m) => pipe.query_async(&mut m).await,
        Conn::Cluster(mut c) => pipe.query_async(&mut c).await,
        Conn::Sentinel(s) => {
            let mut g = s.lock().await;
            let mut c = g.client.get_async_connection().await?;
            let r = pipe.query_async(&mut c).await;
            g.conn = Some(c);
            r
        }
    };
    r.map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unix_and_auth_urls() {
        let t = RedisTarget {
            url: "/run/redis.sock".into(),
            socket_unix: true,
            kind: RedisType::Single,
            auth: Some("pw".into()),
            auth_named: "REDIS_AUTH",
            sentinel_auth: None,
            tls: false,
            tls_ca: None,
            tls_client: None,
            pool_size: 1,
        };
        assert_eq!(url_of(&t, &t.url), "unix:///run/redis.sock?pass=pw");
        let tcp = RedisTarget {
            socket_unix: false,
            tls: true,
            auth: Some("u:pw".into()),
            ..t
        };
        assert_eq!(url_of(&tcp, "h:6379"), "rediss://u:pw@h:6379");
    }
}
