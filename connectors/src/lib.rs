//! Connectors that keep the source's permissions (issue 43): a file share's NTFS ACLs and an
//! Active Directory's users and groups, turned into "who may read this document".
//!
//! Holds: SIDs ([`sid`]), security descriptors parsed from the self-relative binary form
//! ([`sd`]), Windows' access check for reading a file ([`access`]), users and their tokens
//! ([`directory`]), Active Directory over LDAP(S) ([`ad`]), an SMB 2/3 share crawler ([`smb`]),
//! the drift check against the server's own verdict ([`verify`]) and the `Source` trait
//! ([`source`]).
//!
//! Must not know: HTTP (no server, no axum), the daemon's store, index or ACL tables, the
//! configuration file. The daemon drives a [`source::Source`] and writes what it returns through
//! its own one-transaction document + grant path.

pub mod access;
pub mod ad;
pub mod directory;
pub mod fuzzing;
pub mod sd;
pub mod share_acl;
pub mod sid;
pub mod smb;
pub mod source;
pub mod verify;
