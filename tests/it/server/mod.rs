//! Serving and stopping: hot reload (files, ConfigMap swaps, SIGHUP), TLS and mTLS, gRPC on a
//! unix socket, and shutdown (SIGTERM under load, the grace's end, health during the drain).

mod reload;
mod shutdown;
mod tls;
mod uds;
