//! The vocabulary of one decision: an op (one limit for one counter key), how its hits count,
//! how its verdict weighs on the request, and the request's verdict ([`refuses`]). The shard
//! that holds a whole request works the verdict out; the engine does across shards; either way
//! it travels in the `Decision`, and the answer reads it from there.

use smallvec::SmallVec;

use super::algorithm::Params;
use super::key::Key;
use crate::config::QueueSpec;

/// How an op's verdict weighs on the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Over the limit refuses the request.
    Binding,
    /// A joint limit (YAML `quota_mode`): refuses only when every joint group of the request is
    /// over. The ops of one group (a descriptor's limits) are over together: the group is over
    /// when one of them is.
    Joint(JointGroup),
    /// `shadow_mode`: reported, never refuses.
    Shadow,
}

/// Which joint group an op belongs to (its descriptor's index in the request).
pub type JointGroup = u32;

/// One limit to decide for one counter key.
#[derive(Debug, Clone)]
pub struct Op {
    pub key: Key,
    pub params: Params,
    pub hits: u64,
    /// `is_negative_hits`: give `hits` back instead of taking them.
    pub refund: bool,
    /// Whether the hits count when the request is refused.
    pub counting: Counting,
    pub role: Role,
    pub queue: Option<QueueSpec>,
    /// Direct API: the request id under which an admitted hit can be released again.
    pub grant: Option<u64>,
    /// With a store: decide from memory and sync in the background (`Some(true)`), exactly
    /// (`Some(false)`), or as the store policy's default says (`None`).
    pub local_first: Option<bool>,
    /// What the op does with its limit's reservations (`reserve`).
    pub reserve: Reservation,
}

/// What an op does with its limit's reservations: none, YAML's counted holds (`reserve`), or
/// Limitador's named holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Reservation {
    /// No reservation: the limit takes none, or the call carries no `hits_addend` of its own.
    #[default]
    None,
    /// YAML's `reserve`.
    Counted(CountedHolds),
    /// Limitador's `Reserve` and `Commit`, and its other calls beside them.
    Named(NamedHolds),
}

impl Reservation {
    /// What the op does with its key's counted holds (YAML's `reserve`), if anything.
    pub fn counted(self) -> Option<CountedHolds> {
        match self {
            Reservation::Counted(c) => Some(c),
            _ => None,
        }
    }

    /// What the op does with its key's named holds (Limitador's), if anything.
    pub fn named(self) -> Option<NamedHolds> {
        match self {
            Reservation::Named(n) => Some(n),
            _ => None,
        }
    }
}

/// YAML's `reserve`: a check of a limit with it holds hits for its request; the report of the
/// request's usage releases one hold of its key. A key's holds are counted, all of its limit's
/// size: which one a report releases does not matter (the oldest).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CountedHolds {
    /// A check (the op's hits are 0): judged as if it took `hits` more beyond what is held,
    /// and when its request is admitted, holds them for `for_ms` or until a report. `id` names
    /// the hold in a store shared by replicas, so a request refused elsewhere takes back its
    /// own.
    Hold { hits: u32, for_ms: u32, id: u64 },
    /// A report of usage (counted in full): releases the oldest hold of its key, if any. Its
    /// limit's holds are of `hits` each.
    Release { hits: u32 },
}

/// Limitador's named holds: each of its own hits, under the id its `Reserve` named, until a
/// `Commit` of that id ends it or its time passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NamedHolds {
    /// Limitador's `Reserve` (the op's hits are 0): judged as if it took `hits` beyond what its
    /// key's named holds hold; when its request is admitted, holds `hits` under `id` until the
    /// earliest of `for_ms` and the end of the key's window, or a [`NamedHolds::Commit`] of `id`.
    Reserve { hits: u32, for_ms: u32, id: u64 },
    /// Limitador's `Commit`: usage counted in full that ends the named hold `id` of its key, if
    /// the key still holds it (the op's outcome says whether it did: `released`).
    Commit { id: u64 },
    /// An ordinary op judged beside its key's named holds, so room reserved is not room left:
    /// Limitador's calls (beyond Limitador, where they do not see reservations).
    Beside,
}

/// A new hold's name, unique in this process and, drawn from a random start, across replicas.
pub fn hold_id() -> u64 {
    static NEXT: std::sync::LazyLock<std::sync::atomic::AtomicU64> =
        std::sync::LazyLock::new(|| std::sync::atomic::AtomicU64::new(rand::random()));
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// An op as tests write them: one hit on `key`, `limit` a window of `window_ms` by `algorithm`,
/// binding, counted if admitted, no queue, the store policy's default mode.
#[cfg(test)]
pub(crate) fn test_op(
    key: &str,
    algorithm: crate::config::Algorithm,
    limit: u32,
    window_ms: u64,
) -> Op {
    Op {
        key: Key::new(key),
        params: Params {
            requests_per_unit: limit,
            window_ms,
            algorithm,
            calendar: None,
            tat: super::Tat::Full,
        },
        hits: 1,
        refund: false,
        role: Role::Binding,
        queue: None,
        grant: None,
        counting: Counting::IfAdmitted,
        local_first: None,
        reserve: Reservation::None,
    }
}

/// Which hits of a refused request count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Counting {
    /// Only an admitted request's: a refused request consumes nothing.
    #[default]
    IfAdmitted,
    /// Refused or not (`STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=false`), as envoyproxy/ratelimit
    /// counts them, and like it: a fixed window known to be full is answered from the local
    /// over-limit cache without counting more.
    Always,
    /// Usage reported after the fact (a descriptor's own `hits_addend`): counted in full, past
    /// the limit if need be, and always stored.
    Usage,
}

impl Op {
    /// Whether this op's hits are counted whatever the verdict.
    pub fn counts_in_full(&self) -> bool {
        self.counting != Counting::IfAdmitted && self.hits > 0 && !self.refund
    }
}

/// The verdict on one op.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    pub over: bool,
    pub remaining: u32,
    /// How far past the limit the key is with this op's hits (0 when within it): the part of
    /// the hits that is over, when it is less than all of them.
    pub past: u64,
    pub reset_ns: u64,
    pub retry_ns: u64,
    /// Refused only because waiters of its key were ahead of it.
    pub blocked: bool,
    /// A [`NamedHolds::Commit`] that found its hold, and ended it.
    pub released: bool,
}

/// Verdicts in the order of the ops given.
pub type Outcomes = SmallVec<[Outcome; 1]>;

/// Whether a request whose ops have these (role, over) pairs is refused: when a
/// [`Role::Binding`] op is over, or when it has [`Role::Joint`] ops and every joint group is
/// over (a group is over when one of its ops is). [`Role::Shadow`] ops never refuse, and nothing
/// refuses under `global_shadow`.
#[inline]
pub fn refuses(ops: impl IntoIterator<Item = (Role, bool)>, global_shadow: bool) -> bool {
    if global_shadow {
        return false;
    }
    // (group, over) for every joint group seen.
    let mut groups: SmallVec<[(u32, bool); 4]> = SmallVec::new();
    for (role, over) in ops {
        match role {
            Role::Binding if over => return true,
            Role::Joint(g) => match groups.iter_mut().find(|(h, _)| *h == g) {
                Some((_, o)) => *o |= over,
                None => groups.push((g, over)),
            },
            Role::Binding | Role::Shadow => {}
        }
    }
    !groups.is_empty() && groups.iter().all(|&(_, over)| over)
}

#[cfg(test)]
mod tests {
    use super::Role::{Binding, Joint, Shadow};
    use super::*;

    #[test]
    fn a_binding_op_over_refuses() {
        assert!(refuses([(Binding, false), (Binding, true)], false));
        assert!(!refuses([(Binding, false), (Binding, false)], false));
        assert!(refuses([(Binding, true), (Joint(0), false)], false));
    }

    #[test]
    fn joint_groups_refuse_only_when_all_are_over() {
        assert!(!refuses([(Joint(0), true), (Joint(1), false)], false));
        assert!(refuses([(Joint(0), true), (Joint(1), true)], false));
        assert!(refuses([(Joint(0), true), (Binding, false)], false));
    }

    #[test]
    fn a_joint_group_is_over_when_one_of_its_ops_is() {
        // One descriptor with two limits, one over: its group is over.
        assert!(refuses([(Joint(0), true), (Joint(0), false)], false));
        // Two descriptors: refused only when both groups are over.
        assert!(!refuses(
            [(Joint(0), true), (Joint(0), false), (Joint(1), false)],
            false
        ));
        assert!(refuses(
            [(Joint(0), false), (Joint(1), true), (Joint(0), true)],
            false
        ));
    }

    #[test]
    fn shadow_ops_never_refuse() {
        assert!(!refuses([(Shadow, true)], false));
        assert!(!refuses([(Shadow, true), (Joint(0), false)], false));
        assert!(refuses([(Shadow, false), (Joint(0), true)], false));
    }

    #[test]
    fn global_shadow_never_refuses() {
        assert!(!refuses([(Binding, true)], true));
        assert!(!refuses([(Joint(0), true)], true));
    }

    #[test]
    fn no_ops_no_refusal() {
        assert!(!refuses([], false));
    }
}
