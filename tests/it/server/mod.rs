//! Serving and stopping: hot reload (files, ConfigMap swaps, SIGHUP), TLS and mTLS, gRPC on a
//! unix socket, shutdown (SIGTERM under load, the grace's end, health during the drain), and
//! what stops a start (`start`: a taken port).

mod doors;
mod reload;
mod shutdown;
mod start;
mod tls;
mod uds;
