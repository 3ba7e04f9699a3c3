//! The real Samba AD domain controller of the connectors' own tests (tests/samba/start-dc.sh,
//! driven by connectors/tests/support): shared, not copied. Without Samba or root a test using
//! it prints a loud SKIPPED line and returns; with `AIRLOCK_REQUIRE_SAMBA=1` it fails instead.

#[path = "../../../connectors/tests/support/mod.rs"]
mod dc;

pub use dc::Dc;
