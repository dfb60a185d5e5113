//! The request verdict: whether a request is refused, from its ops' roles and which are over.

use super::Role;

/// Whether a request whose ops have these (role, over) pairs is refused: when a
/// [`Role::Binding`] op is over, or when it has [`Role::Quota`] ops and every one of them is
/// over. [`Role::Shadow`] ops never refuse, and nothing refuses under `global_shadow`.
#[inline]
pub fn refuses(ops: impl IntoIterator<Item = (Role, bool)>, global_shadow: bool) -> bool {
    if global_shadow {
        return false;
    }
    let mut quota_seen = false;
    let mut quota_all_over = true;
    for (role, over) in ops {
        match role {
            Role::Binding if over => return true,
            Role::Quota => {
                quota_seen = true;
                quota_all_over &= over;
            }
            Role::Binding | Role::Shadow => {}
        }
    }
    quota_seen && quota_all_over
}

#[cfg(test)]
mod tests {
    use super::Role::{Binding, Quota, Shadow};
    use super::*;

    #[test]
    fn a_binding_op_over_refuses() {
        assert!(refuses([(Binding, false), (Binding, true)], false));
        assert!(!refuses([(Binding, false), (Binding, false)], false));
        assert!(refuses([(Binding, true), (Quota, false)], false));
    }

    #[test]
    fn quota_ops_refuse_only_when_all_are_over() {
        assert!(!refuses([(Quota, true), (Quota, false)], false));
        assert!(refuses([(Quota, true), (Quota, true)], false));
        assert!(refuses([(Quota, true), (Binding, false)], false));
    }

    #[test]
    fn shadow_ops_never_refuse() {
        assert!(!refuses([(Shadow, true)], false));
        assert!(!refuses([(Shadow, true), (Quota, false)], false));
        assert!(refuses([(Shadow, false), (Quota, true)], false));
    }

    #[test]
    fn global_shadow_never_refuses() {
        assert!(!refuses([(Binding, true)], true));
        assert!(!refuses([(Quota, true)], true));
    }

    #[test]
    fn no_ops_no_refusal() {
        assert!(!refuses([], false));
    }
}
