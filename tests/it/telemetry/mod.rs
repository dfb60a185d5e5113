//! What the server tells operators: its metrics on every port (`metrics`, `metrics_ports`), the
//! Prometheus port's mapped series (`mapped`), the statsd push (`statsd`), the dashboards and
//! alert rules that read them (`dashboards`), logs (`logs`), traces and log lines of the binary
//! (`traces`), and client values kept out of all of them (`client_values`).

mod client_values;
mod dashboards;
mod logs;
mod mapped;
mod metrics;
mod metrics_ports;
mod statsd;
pub mod traces;
