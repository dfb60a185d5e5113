//! The request verdict: whether a request is refused, from its ops' roles and which are over.
//! The shard that holds a whole request works it out; the engine does across shards; either
//! way it travels in the `Decision`, and the answer reads it from there.

use smallvec::SmallVec;

use super::Role;

/// Whether a request whose ops have these (role, over) pairs is refused: when a
/// [`Role::Binding`] op is over, or when it has [`Role::Quota`] ops and every quota group is
/// over (a group is over when one of its ops is). [`Role::Shadow`] ops never refuse, and nothing
/// refuses under `global_shadow`.
#[inline]
pub fn refuses(ops: impl IntoIterator<Item = (Role, bool)>, global_shadow: bool) -> bool {
    if global_shadow {
        return false;
    }
    // (group, over) for every quota group seen.
    let mut groups: SmallVec<[(u32, bool); 4]> = SmallVec::new();
    for (role, over) in ops {
        match role {
            Role::Binding if over => return true,
            Role::Quota(g) => match groups.iter_mut().find(|(h, _)| *h == g) {
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
    use super::Role::{Binding, Quota, Shadow};
    use super::*;

    #[test]
    fn a_binding_op_over_refuses() {
        assert!(refuses([(Binding, false), (Binding, true)], false));
        assert!(!refuses([(Binding, false), (Binding, false)], false));
        assert!(refuses([(Binding, true), (Quota(0), false)], false));
    }

    #[test]
    fn quota_groups_refuse_only_when_all_are_over() {
        assert!(!refuses([(Quota(0), true), (Quota(1), false)], false));
        assert!(refuses([(Quota(0), true), (Quota(1), true)], false));
        assert!(refuses([(Quota(0), true), (Binding, false)], false));
    }

    #[test]
    fn a_quota_group_is_over_when_one_of_its_ops_is() {
        // One descriptor with two limits, one over: its group is over.
        assert!(refuses([(Quota(0), true), (Quota(0), false)], false));
        // Two descriptors: refused only when both groups are over.
        assert!(!refuses(
            [(Quota(0), true), (Quota(0), false), (Quota(1), false)],
            false
        ));
        assert!(refuses(
            [(Quota(0), false), (Quota(1), true), (Quota(0), true)],
            false
        ));
    }

    #[test]
    fn shadow_ops_never_refuse() {
        assert!(!refuses([(Shadow, true)], false));
        assert!(!refuses([(Shadow, true), (Quota(0), false)], false));
        assert!(refuses([(Shadow, false), (Quota(0), true)], false));
    }

    #[test]
    fn global_shadow_never_refuses() {
        assert!(!refuses([(Binding, true)], true));
        assert!(!refuses([(Quota(0), true)], true));
    }

    #[test]
    fn no_ops_no_refusal() {
        assert!(!refuses([], false));
    }
}
