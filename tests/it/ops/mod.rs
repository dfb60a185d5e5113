//! Operating the server: the binary and its CLI, settings, reload, xDS, TLS, metrics, statsd,
//! the debug port, dashboards, the admin listener, client values on open ports.

mod admin;
mod big_config;
mod binary;
mod cli;
mod client_values;
mod dashboards;
mod mapped;
mod metrics;
mod reload;
mod settings;
mod statsd;
mod status_page;
mod tls;
mod top;
mod xds;
