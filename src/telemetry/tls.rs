//! Counters of gRPC's TLS: handshakes that failed, certificate reloads. `server`'s TLS code
//! holds them.

use std::sync::atomic::AtomicU64;

#[derive(Debug, Default)]
pub struct TlsStats {
    /// gRPC connections dropped because their TLS handshake failed.
    pub handshake_errors: AtomicU64,
    pub reload_success: AtomicU64,
    pub reload_error: AtomicU64,
}
