//! Every door's calls, errors and latency, one family each with a `door` label: counted where
//! doors are wired (the gRPC and HTTP call layers, the RESP connection), never by a door
//! itself, so a door cannot leave them out.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::telemetry::exposition::{family, Metrics, Pushed};
use crate::telemetry::Histogram;

/// A way in, as the request series and the call spans name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Door {
    /// Envoy's `ShouldRateLimit` (gRPC) and `POST /json`.
    Envoy,
    /// As `limitador-server`: its `ShouldRateLimit`, Kuadrant's service, its HTTP API.
    Limitador,
    /// GoCC's `/rate`.
    Gocc,
    /// ThrottleCrab's `THROTTLE` and `/throttle`, redis-cell's `CL.THROTTLE`.
    Throttle,
}

impl Door {
    pub const ALL: [Door; 4] = [Door::Envoy, Door::Limitador, Door::Gocc, Door::Throttle];

    /// The `door` label's value.
    pub fn name(self) -> &'static str {
        match self {
            Door::Envoy => "envoy",
            Door::Limitador => "limitador",
            Door::Gocc => "gocc",
            Door::Throttle => "throttle",
        }
    }
}

/// Why a call got no decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failed {
    /// The caller's request is wrong (gRPC INVALID_ARGUMENT, HTTP 4xx but 429).
    InvalidArgument,
    /// Shed: queues or mailboxes full (RESOURCE_EXHAUSTED).
    Overloaded,
    /// No store to decide with (UNAVAILABLE, HTTP 503).
    Unavailable,
    /// Anything else the server answered with an error.
    Internal,
}

impl Failed {
    const ALL: [(Failed, &'static str); 4] = [
        (Failed::InvalidArgument, "invalid_argument"),
        (Failed::Overloaded, "overloaded"),
        (Failed::Unavailable, "unavailable"),
        (Failed::Internal, "internal"),
    ];

    /// A gRPC status code's kind; none for OK.
    pub fn of_grpc(code: i32) -> Option<Failed> {
        match code {
            0 => None,
            3 => Some(Failed::InvalidArgument),
            8 => Some(Failed::Overloaded),
            14 => Some(Failed::Unavailable),
            _ => Some(Failed::Internal),
        }
    }

    /// An HTTP status's kind: 429 is a decision, not an error.
    pub fn of_http(status: u16) -> Option<Failed> {
        match status {
            429 => None,
            503 => Some(Failed::Unavailable),
            400..=499 => Some(Failed::InvalidArgument),
            500.. => Some(Failed::Internal),
            _ => None,
        }
    }
}

/// One door's calls.
#[derive(Debug, Default)]
pub struct CallStats {
    pub requests: AtomicU64,
    /// By [`Failed`], in its order.
    failed: [AtomicU64; 4],
    /// From the call's arrival to its answer, queued waits included.
    pub latency: Histogram,
}

impl CallStats {
    /// One call answered (or failed, as `failed` says) after `latency`.
    pub fn count(&self, failed: Option<Failed>, latency: Duration) {
        self.latency.observe(latency);
        self.requests.fetch_add(1, Ordering::Relaxed);
        if let Some(f) = failed {
            self.failed[f as usize].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Calls that failed as `f` says.
    pub fn failed(&self, f: Failed) -> u64 {
        self.failed[f as usize].load(Ordering::Relaxed)
    }
}

/// Every door's [`CallStats`]; the process holds one, shared by every layer that counts.
#[derive(Debug, Default)]
pub struct DoorCalls {
    doors: [CallStats; 4],
}

impl DoorCalls {
    pub fn door(&self, d: Door) -> &CallStats {
        &self.doors[d as usize]
    }
}

/// The call's timer of Envoy's door (`metrics/metrics.go:25`, scope `ratelimit_server`,
/// `runner.go:181`).
const RESPONSE_TIME: &str = "ratelimit_server.ShouldRateLimit.response_time";

impl Metrics for DoorCalls {
    fn render(&self, out: &mut String) {
        let name = "ratelimit_service_requests_total";
        family(out, name, "Calls answered or failed, by door.", "counter");
        for d in Door::ALL {
            let n = self.door(d).requests.load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}{{door=\"{}\"}} {n}", d.name());
        }
        let name = "ratelimit_service_errors_total";
        let help = "Calls that got no decision, by door and kind.";
        family(out, name, help, "counter");
        for d in Door::ALL {
            for (f, kind) in Failed::ALL {
                let n = self.door(d).failed(f);
                let _ = writeln!(out, "{name}{{door=\"{}\",kind=\"{kind}\"}} {n}", d.name());
            }
        }
        let name = "ratelimit_service_request_duration_seconds";
        let help = "Time from a call's arrival to its answer, queued waits included, by door.";
        family(out, name, help, "histogram");
        for d in Door::ALL {
            let label = format!("door=\"{}\"", d.name());
            self.door(d).latency.render_series(out, name, &label);
        }
    }

    /// `service/ratelimit.go:427-432`: Envoy's door as the reference pushes it: Redis errors,
    /// the service's own errors, the calls and their timer.
    fn push(&self, out: &mut Pushed) {
        let envoy = self.door(Door::Envoy);
        let call = "ratelimit.service.call.should_rate_limit";
        out.add(
            format!("{call}.redis_error"),
            envoy.failed(Failed::Unavailable),
        );
        let service_errors = envoy.failed(Failed::InvalidArgument)
            + envoy.failed(Failed::Overloaded)
            + envoy.failed(Failed::Internal);
        out.add(format!("{call}.service_error"), service_errors);
        out.add(
            "ratelimit_server.ShouldRateLimit.total_requests".into(),
            envoy.requests.load(Ordering::Relaxed),
        );
        out.timer(RESPONSE_TIME, &envoy.latency);
    }
}
