//! gRPC over TLS and mTLS. The rustls config lives in an `ArcSwap` that a watcher replaces
//! when the certificate files change; each connection is handshaken with the config live when
//! it arrives, so a rotated certificate is used by new connections without a restart.

use std::future::Future;
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use futures_util::Stream;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

use crate::settings::TlsSettings;
use crate::source::files::Watched;
use crate::telemetry::exposition::{single, Metrics};

/// Stats of gRPC's TLS: handshakes that failed, certificate reloads; counted here alone.
#[derive(Debug, Default)]
pub(crate) struct TlsStats {
    /// gRPC connections dropped because their TLS handshake failed.
    handshake_errors: AtomicU64,
    reload_success: AtomicU64,
    reload_error: AtomicU64,
}

fn add(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

impl Metrics for TlsStats {
    fn render(&self, out: &mut String) {
        for (name, help, c) in [
            (
                "ratelimit_service_tls_handshake_errors_total",
                "gRPC connections dropped because their TLS handshake failed.",
                &self.handshake_errors,
            ),
            (
                "ratelimit_service_tls_reload_success_total",
                "Certificate reloads that succeeded.",
                &self.reload_success,
            ),
            (
                "ratelimit_service_tls_reload_error_total",
                "Certificate reloads that failed (the old certificate stayed live).",
                &self.reload_error,
            ),
        ] {
            single(out, name, help, "counter", c.load(Ordering::Relaxed));
        }
    }
}

/// A client that has not finished its handshake by then is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The TLS settings and the config built from their files.
pub(crate) struct TlsState {
    settings: TlsSettings,
    live: ArcSwap<ServerConfig>,
    /// Handshakes that failed, reloads.
    stats: Arc<TlsStats>,
}

impl TlsState {
    pub(crate) fn new(settings: TlsSettings, stats: Arc<TlsStats>) -> Result<TlsState, String> {
        let config = build(&settings)?;
        Ok(TlsState {
            settings,
            live: ArcSwap::from_pointee(config),
            stats,
        })
    }

    /// Rebuilds from the files; on error the old config stays live.
    pub(crate) fn reload(&self) {
        match build(&self.settings) {
            Ok(c) => {
                self.live.store(Arc::new(c));
                add(&self.stats.reload_success);
                tracing::info!(cert = %self.settings.cert.display(), "TLS certificates reloaded");
            }
            Err(e) => {
                add(&self.stats.reload_error);
                tracing::error!(error = %e, "TLS reload failed; the previous certificates stay live");
            }
        }
    }

    async fn handshake<IO>(&self, io: IO) -> Result<TlsStream<IO>, String>
    where
        IO: AsyncRead + AsyncWrite + Unpin,
    {
        let acceptor = TlsAcceptor::from(self.live.load_full());
        let stream = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(io))
            .await
            .map_err(|_| "handshake timed out".to_owned())?
            .map_err(|e| e.to_string())?;
        if let Some(san) = &self.settings.client_san {
            check_san(&stream, san)?;
        }
        Ok(stream)
    }
}

/// The files whose change means a reload.
pub(crate) fn watched(s: &TlsSettings) -> Watched {
    let mut files = vec![s.cert.clone(), s.key.clone()];
    files.extend(s.client_ca.clone());
    Watched::Files(files)
}

fn build(s: &TlsSettings) -> Result<ServerConfig, String> {
    let certs = read_certs(&s.cert, "GRPC_SERVER_TLS_CERT")?;
    let key = PrivateKeyDer::from_pem_file(&s.key)
        .map_err(|e| format!("GRPC_SERVER_TLS_KEY {}: {e}", s.key.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    let builder = match &s.client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            for c in read_certs(ca, "GRPC_CLIENT_TLS_CACERT")? {
                roots
                    .add(c)
                    .map_err(|e| format!("GRPC_CLIENT_TLS_CACERT {}: {e}", ca.display()))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| format!("GRPC_CLIENT_TLS_CACERT {}: {e}", ca.display()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder
        .with_single_cert(certs, key)
        .map_err(|e| format!("GRPC_SERVER_TLS_CERT/KEY: {e}"))?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}

fn read_certs(path: &Path, var: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("{var} {}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{var} {}: no certificate", path.display()));
    }
    Ok(certs)
}

/// `GRPC_CLIENT_TLS_SAN`: the client certificate must name `san` (a DNS name or an IP).
fn check_san<IO>(stream: &TlsStream<IO>, san: &str) -> Result<(), String> {
    let cert = stream
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .ok_or("client sent no certificate")?;
    let name = ServerName::try_from(san).map_err(|e| format!("GRPC_CLIENT_TLS_SAN {san}: {e}"))?;
    webpki::EndEntityCert::try_from(cert)
        .and_then(|c| c.verify_is_valid_for_subject_name(&name))
        .map_err(|e| format!("client certificate is not for {san}: {e}"))
}

/// Listeners the accept loop can take connections from.
pub(crate) trait Accept: Send + 'static {
    type Io: AsyncRead + AsyncWrite + Unpin + Send + 'static;
    fn accept(&self) -> impl Future<Output = io::Result<Self::Io>> + Send;
}

impl Accept for tokio::net::TcpListener {
    type Io = tokio::net::TcpStream;
    async fn accept(&self) -> io::Result<Self::Io> {
        let (s, _) = tokio::net::TcpListener::accept(self).await?;
        let _ = s.set_nodelay(true);
        Ok(s)
    }
}

impl Accept for tokio::net::UnixListener {
    type Io = tokio::net::UnixStream;
    async fn accept(&self) -> io::Result<Self::Io> {
        tokio::net::UnixListener::accept(self).await.map(|(s, _)| s)
    }
}

/// Accepted, handshaken connections. Each handshake runs in a task of its own, so a slow or
/// silent client never holds up the next one; failures are logged at debug and counted.
/// The accept loop ends when the server drops the stream.
pub(crate) fn incoming<L: Accept>(
    listener: L,
    tls: Arc<TlsState>,
) -> impl Stream<Item = io::Result<TlsStream<L::Io>>> {
    let (tx, mut rx) = mpsc::channel::<io::Result<TlsStream<L::Io>>>(128);
    tokio::spawn(async move {
        loop {
            let io = tokio::select! {
                r = listener.accept() => r,
                _ = tx.closed() => return,
            };
            let io = match io {
                Ok(io) => io,
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let tx = tx.clone();
            let tls = tls.clone();
            tokio::spawn(async move {
                match tls.handshake(io).await {
                    Ok(s) => {
                        let _ = tx.send(Ok(s)).await;
                    }
                    Err(e) => {
                        add(&tls.stats.handshake_errors);
                        tracing::debug!(error = %e, "TLS handshake failed");
                    }
                }
            });
        }
    });
    futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
}
