//! Who is asking: the identity every handler and the admission layer work with, resolved by
//! [`crate::auth`] from a token or the SSO proxy. A leaf module (no imports from the crate).

/// An authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The user id.
    pub user_id: String,
    /// Whether the user has the `admin` role.
    pub admin: bool,
}
