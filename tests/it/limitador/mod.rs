//! turnstile started as limitador-operator starts Limitador: the binary named
//! `limitador-server`, Limitador's command line, its limits file, its gRPC and HTTP APIs. Every
//! expected value was read off the real limitador-server (Kuadrant/limitador 2981b2b, built and
//! run here with the same `limits.yaml`), unless a comment says turnstile differs on purpose
//! (docs/limitador.md lists each difference).

mod command_line;
mod environment;
mod envoy;
mod grpc;
mod http;
mod limits_file;
mod partitioned;
mod redis;
mod reserve;
mod reserve_contract;
mod start_errors;

use std::path::{Path, PathBuf};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
    rate_limit_descriptor::Entry, RateLimitDescriptor,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tonic::codegen::http::uri::PathAndQuery;
use tonic_prost::ProstCodec;

use crate::common::binary::{Server, BIN};
use crate::common::tempdir::TempDir;

/// The limits every test serves (Kuadrant's two shapes, general CEL, two descriptors, limits
/// applying together, `max_value: 0`, a repeated identity, an `id`).
pub const LIMITS: &str = include_str!("limits.yaml");

/// The binary under Limitador's name, in `dir`.
pub fn limitador_server(dir: &Path) -> PathBuf {
    let exe = dir.join("limitador-server");
    if !exe.exists() {
        std::os::unix::fs::symlink(BIN, &exe).expect("symlink limitador-server");
    }
    exe
}

/// A running `limitador-server`, with the limits file it serves.
pub struct Limitador {
    pub server: Server,
    pub limits: PathBuf,
    _dir: TempDir,
}

impl Limitador {
    /// Started as limitador-operator starts it, on loopback ports the OS picks: `flags`, then
    /// `--http-port 0 --rls-port 0 --metric-labels-default 'descriptors[1]' LIMITS memory`.
    pub fn start(flags: &[&str], limits: &str) -> Limitador {
        Limitador::start_with(flags, limits, &[])
    }

    /// As [`Limitador::start`], with `env` in its environment too.
    pub fn start_with(flags: &[&str], limits: &str, env: &[(&str, &str)]) -> Limitador {
        Limitador::start_on(flags, limits, &["memory"], env)
    }

    /// Started as [`Limitador::start`] with `storage` (its arguments) instead of `memory`,
    /// and `env` beside the loopback hosts.
    pub fn start_on(
        flags: &[&str],
        limits: &str,
        storage: &[&str],
        env: &[(&str, &str)],
    ) -> Limitador {
        let dir = TempDir::new("limitador");
        let file = dir.path().join("limitador-config.yaml");
        std::fs::write(&file, limits).unwrap();
        let exe = limitador_server(dir.path());
        let mut args: Vec<&str> = flags.to_vec();
        let file_arg = file.to_str().unwrap().to_owned();
        args.extend(["--http-port", "0", "--rls-port", "0"]);
        args.extend(["--metric-labels-default", "descriptors[1]"]);
        args.push(file_arg.as_str());
        args.extend(storage);
        let mut env = env.to_vec();
        env.extend([
            ("ENVOY_RLS_HOST", "127.0.0.1"),
            ("HTTP_API_HOST", "127.0.0.1"),
        ]);
        Limitador {
            server: Server::start(&exe, &args, &env),
            limits: file,
            _dir: dir,
        }
    }

    pub fn grpc(&self) -> String {
        format!("http://{}", self.server.ports.grpc_addr())
    }

    pub fn http(&self, path: &str) -> String {
        format!("http://{}{path}", self.server.ports.http)
    }
}

/// A request to `domain` with one descriptor a list of entries.
pub fn request(
    domain: &str,
    descriptors: &[&[(&str, &str)]],
    hits_addend: u32,
) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.into(),
        descriptors: (descriptors.iter())
            .map(|d| RateLimitDescriptor {
                entries: (d.iter())
                    .map(|(k, v)| Entry {
                        key: (*k).into(),
                        value: (*v).into(),
                    })
                    .collect(),
                ..Default::default()
            })
            .collect(),
        hits_addend,
    }
}

/// The wasm-shim's descriptor for Kuadrant's `toystore-get` limit and user `user`.
pub fn toystore(user: &str) -> RateLimitRequest {
    let d: &[(&str, &str)] = &[
        ("limit.toystore_get__1a2b3c4d", "1"),
        ("auth.identity.userid", user),
    ];
    request("ns/route", &[d], 0)
}

/// A unary call of `method` (`/package.Service/Method`) on `grpc`.
pub async fn unary(
    grpc: &str,
    method: &'static str,
    req: RateLimitRequest,
) -> Result<RateLimitResponse, tonic::Status> {
    call(grpc, method, req).await
}

/// A unary call of `method` with its messages `Req` and `Resp`.
pub async fn call<Req, Resp>(
    grpc: &str,
    method: &'static str,
    req: Req,
) -> Result<Resp, tonic::Status>
where
    Req: prost::Message + Send + Sync + 'static,
    Resp: prost::Message + Default + Send + Sync + 'static,
{
    let channel = tonic::transport::Endpoint::from_shared(grpc.to_owned())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = tonic::client::Grpc::new(channel);
    client.ready().await.unwrap();
    let codec: ProstCodec<Req, Resp> = ProstCodec::default();
    let path = PathAndQuery::from_static(method);
    let answer = client.unary(tonic::Request::new(req), path, codec).await;
    answer.map(tonic::Response::into_inner)
}

pub const SHOULD_RATE_LIMIT: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";
pub const CHECK: &str = "/kuadrant.service.ratelimit.v1.RateLimitService/CheckRateLimit";
pub const REPORT: &str = "/kuadrant.service.ratelimit.v1.RateLimitService/Report";

/// `overall_code` as Envoy's enum names it.
pub fn code(r: &RateLimitResponse) -> &'static str {
    match r.overall_code {
        0 => "UNKNOWN",
        1 => "OK",
        2 => "OVER_LIMIT",
        _ => "?",
    }
}
