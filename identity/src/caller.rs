//! Who is asking: the identity every handler and the admission layer work with, resolved by
//! the appliance's `auth` from a token, a session or the SSO proxy. A leaf module.

use airlock_acl::Role;

/// An authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The user id.
    pub user_id: String,
    /// Privileged: holds the `admin` or `operator` role (the admin quotas, stage timings, the
    /// rung override of evals). Which routes a caller may use is decided by its `roles`
    /// ([`crate::roles`]), never by this flag.
    pub admin: bool,
    /// The roles (none: an ordinary user).
    pub roles: Vec<Role>,
}

impl Caller {
    /// A caller with `roles`.
    pub fn new(user_id: String, roles: Vec<Role>) -> Self {
        Caller {
            admin: roles.contains(&Role::Admin) || roles.contains(&Role::Operator),
            user_id,
            roles,
        }
    }

    /// Whether the caller holds `role`.
    pub fn has(&self, role: Role) -> bool {
        self.roles.contains(&role)
    }
}
