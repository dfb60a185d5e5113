//! Every socket the server serves, bound before anything starts, so a taken port fails the start
//! naming the port and the settings that chose it: the debug and Prometheus ports too (a
//! liveness probe may be on either, and a port missing reads as switched off on purpose), and
//! the admin listener, which is off unless asked for.

use std::net::{SocketAddr, TcpListener as StdListener};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::UnixListener as StdUnixListener;
use std::path::Path;

use socket2::{Domain, Protocol, Socket, Type};

use super::StartError;
use crate::settings::Settings;

/// What one worker accepts gRPC connections from.
pub(super) enum GrpcListener {
    Tcp(StdListener),
    Unix(StdUnixListener),
}

/// The bound sockets, ready for the runtimes that will serve them.
pub(super) struct Listeners {
    /// One handle per worker to the same gRPC socket.
    pub(super) grpc: Vec<GrpcListener>,
    /// The TCP address gRPC listens on; unspecified (`0.0.0.0:0`) when serving on a unix socket.
    pub(super) grpc_addr: SocketAddr,
    pub(super) http: StdListener,
    pub(super) debug: Option<StdListener>,
    pub(super) prometheus: Option<StdListener>,
    pub(super) resp: Option<StdListener>,
    /// `TURNSTILE_ADMIN_ADDR`: asked for explicitly, so a taken port fails the start.
    pub(super) admin: Option<StdListener>,
}

/// The side thread's HTTP ports, when bound: debug, Prometheus and admin.
pub(super) struct HttpPorts {
    pub(super) debug: Option<StdListener>,
    pub(super) prometheus: Option<StdListener>,
    pub(super) admin: Option<StdListener>,
}

impl Listeners {
    /// The address the HTTP port got (the port the OS chose for port 0).
    pub(super) fn http_addr(&self, settings: &Settings) -> Result<SocketAddr, StartError> {
        local_addr(&self.http, settings.http_addr, settings.port_names.http)
    }

    /// The side thread's HTTP ports, taken out: the workers serve the rest.
    pub(super) fn side_ports(&mut self) -> HttpPorts {
        HttpPorts {
            debug: self.debug.take(),
            prometheus: self.prometheus.take(),
            admin: self.admin.take(),
        }
    }

    pub(super) fn bind(settings: &Settings) -> Result<Listeners, StartError> {
        let workers = settings.workers.max(1);
        let (grpc, grpc_addr) = match &settings.grpc_uds {
            Some(path) => (
                bind_uds(path, workers)?
                    .into_iter()
                    .map(GrpcListener::Unix)
                    .collect(),
                SocketAddr::from(([0, 0, 0, 0], 0)),
            ),
            None => {
                let port = settings.port_names.grpc;
                let l = bind_shared(settings.grpc_addr, workers, port)?;
                let addr = local_addr(&l[0], settings.grpc_addr, port)?;
                (l.into_iter().map(GrpcListener::Tcp).collect(), addr)
            }
        };
        let resp = match &settings.resp {
            Some(r) => Some(r.bind().map_err(|source| StartError::Bind {
                addr: r.addr,
                port: "the RESP port (TURNSTILE_RESP_ADDR)",
                source,
            })?),
            None => None,
        };
        let one = |addr, port| bind_shared(addr, 1, port).map(|mut l| l.remove(0));
        let http = one(settings.http_addr, settings.port_names.http)?;
        let admin = (settings.admin.as_ref())
            .map(|a| one(a.addr, "the admin listener (TURNSTILE_ADMIN_ADDR)"))
            .transpose()?;
        let debug = (settings.debug_addr)
            .map(|a| one(a, "the debug port (DEBUG_HOST, DEBUG_PORT)"))
            .transpose()?;
        let prometheus = (settings.prometheus.as_ref())
            .map(|p| one(p.addr, "the Prometheus port (PROMETHEUS_ADDR)"))
            .transpose()?;
        Ok(Listeners {
            grpc,
            grpc_addr,
            http,
            debug,
            prometheus,
            resp,
            admin,
        })
    }
}

/// The addresses the optional listeners got; `None` for those not bound.
pub(super) struct OptionalAddrs {
    pub(super) debug: Option<SocketAddr>,
    pub(super) prometheus: Option<SocketAddr>,
    pub(super) resp: Option<SocketAddr>,
    pub(super) admin: Option<SocketAddr>,
}

impl Listeners {
    pub(super) fn optional_addrs(&self) -> OptionalAddrs {
        let bound = |l: &Option<StdListener>| l.as_ref().and_then(|l| l.local_addr().ok());
        OptionalAddrs {
            debug: bound(&self.debug),
            prometheus: bound(&self.prometheus),
            resp: bound(&self.resp),
            admin: bound(&self.admin),
        }
    }
}

/// The address a listener got (the port the OS chose for port 0).
fn local_addr(
    l: &StdListener,
    asked: SocketAddr,
    port: &'static str,
) -> Result<SocketAddr, StartError> {
    l.local_addr().map_err(|source| StartError::Bind {
        addr: asked,
        port,
        source,
    })
}

/// `GRPC_UDS`: one unix socket, `n` handles to it. A socket left behind by a previous run is
/// removed first; any other file at the path is an error.
fn bind_uds(path: &Path, n: usize) -> Result<Vec<StdUnixListener>, StartError> {
    let err = |source| StartError::BindUnix {
        path: path.to_path_buf(),
        source,
    };
    if std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket()) {
        let _ = std::fs::remove_file(path);
    }
    let first = StdUnixListener::bind(path).map_err(err)?;
    first.set_nonblocking(true).map_err(err)?;
    let mut out = Vec::with_capacity(n);
    for _ in 1..n {
        out.push(first.try_clone().map_err(err)?);
    }
    out.insert(0, first);
    Ok(out)
}

/// One listening socket, and `n` handles to it: each worker's runtime polls its own handle and
/// whichever worker is free accepts the next connection. (Unlike `SO_REUSEPORT`, a second process
/// cannot silently bind the same port.)
fn bind_shared(
    addr: SocketAddr,
    n: usize,
    port: &'static str,
) -> Result<Vec<StdListener>, StartError> {
    let err = |source| StartError::Bind { addr, port, source };
    let socket =
        Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP)).map_err(err)?;
    socket.set_reuse_address(true).map_err(err)?;
    if addr.is_ipv6() {
        // `::` serves IPv4 too, as HOST=:: does for envoyproxy/ratelimit.
        let _ = socket.set_only_v6(false);
    }
    socket.set_nonblocking(true).map_err(err)?;
    socket.bind(&addr.into()).map_err(err)?;
    socket.listen(1024).map_err(err)?;
    let first: StdListener = socket.into();
    let mut out = Vec::with_capacity(n);
    for _ in 1..n {
        out.push(first.try_clone().map_err(err)?);
    }
    out.insert(0, first);
    Ok(out)
}
