//! Stats of the admin listener's actions (look-up, reset, heavy hitters, digests) by outcome, refusals included.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::telemetry::exposition::{family, Metrics};

/// What the admin listener was asked to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdminAction {
    LookUp,
    Reset,
    /// The heavy hitters with clear values (`/admin/top`).
    Top,
    /// Digests of given values (`/admin/digest`).
    Digest,
}

/// How an admin action ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdminOutcome {
    Done,
    /// Malformed: bad JSON, a bad descriptor, hits given.
    BadRequest,
    /// Unknown domain, descriptor without a limit, unknown limit name.
    NotFound,
    /// No token, or a wrong one (401).
    Unauthorized,
    /// A caller off loopback on a listener without a token (403).
    Forbidden,
    /// The engine or the store could not act.
    Unavailable,
}

const ACTIONS: [(AdminAction, &str); 4] = [
    (AdminAction::LookUp, "look_up"),
    (AdminAction::Reset, "reset"),
    (AdminAction::Top, "top"),
    (AdminAction::Digest, "digest"),
];

const OUTCOMES: [(AdminOutcome, &str); 6] = [
    (AdminOutcome::Done, "done"),
    (AdminOutcome::BadRequest, "bad_request"),
    (AdminOutcome::NotFound, "not_found"),
    (AdminOutcome::Unauthorized, "unauthorized"),
    (AdminOutcome::Forbidden, "forbidden"),
    (AdminOutcome::Unavailable, "unavailable"),
];

/// `turnstile_admin_actions_total{action, outcome}`.
#[derive(Debug, Default)]
pub struct AdminStats {
    counts: [[AtomicU64; OUTCOMES.len()]; ACTIONS.len()],
}

impl AdminStats {
    pub fn count(&self, action: AdminAction, outcome: AdminOutcome) {
        let a = ACTIONS.iter().position(|(x, _)| *x == action).unwrap_or(0);
        let o = OUTCOMES
            .iter()
            .position(|(x, _)| *x == outcome)
            .unwrap_or(0);
        self.counts[a][o].fetch_add(1, Ordering::Relaxed);
    }
}

impl Metrics for AdminStats {
    /// Every pair (zeros too, so a rate over them has a series to start from).
    fn render(&self, out: &mut String) {
        let name = "turnstile_admin_actions_total";
        let help = "Admin listener actions by outcome, refused calls included.";
        family(out, name, help, "counter");
        for (a, (_, action)) in ACTIONS.iter().enumerate() {
            for (o, (_, outcome)) in OUTCOMES.iter().enumerate() {
                let n = self.counts[a][o].load(Ordering::Relaxed);
                let _ = writeln!(
                    out,
                    "{name}{{action=\"{action}\",outcome=\"{outcome}\"}} {n}"
                );
            }
        }
    }
}
