//! `bundles/state.json`: which version is current, which is previous, the rollback floor.

use semver::Version;
use serde::{Deserialize, Serialize};

const STATE_FORMAT: &str = "airlock-bundle-state/v1";
const HISTORY_KEPT: usize = 200;

/// The install store's state. Replaced atomically (temp file, fsync, rename, fsync of the
/// directory) after the bundle directories it names are complete and synced.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct State {
    format: String,
    /// The version the daemon runs.
    pub current: Option<Version>,
    /// The version `airlock rollback` switches to.
    pub previous: Option<Version>,
    /// The highest version ever installed: the rollback floor for `install`.
    pub highest_installed: Option<Version>,
    /// Installs and rollbacks, oldest first (the last 200).
    pub history: Vec<HistoryEntry>,
}

/// One recorded state change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HistoryEntry {
    /// RFC 3339 time of the change.
    pub at: String,
    /// `install` or `rollback`.
    pub action: String,
    /// The version that became current.
    pub version: Version,
    /// The version that was current before, if any.
    pub from: Option<Version>,
}

impl Default for State {
    fn default() -> Self {
        State {
            format: STATE_FORMAT.into(),
            current: None,
            previous: None,
            highest_installed: None,
            history: Vec::new(),
        }
    }
}

impl State {
    pub(crate) fn from_json(bytes: &[u8]) -> Result<State, String> {
        let state: State = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
        if state.format != STATE_FORMAT {
            return Err(format!("unknown format {:?}", state.format));
        }
        Ok(state)
    }

    pub(crate) fn to_json(&self) -> Vec<u8> {
        let mut v = serde_json::to_vec_pretty(self).expect("serialising the store state");
        v.push(b'\n');
        v
    }

    pub(crate) fn record(&mut self, action: &str, version: &Version, from: Option<Version>) {
        let now = time::OffsetDateTime::now_utc();
        let at = now
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap_or_default();
        self.history.push(HistoryEntry {
            at,
            action: action.into(),
            version: version.clone(),
            from,
        });
        if self.history.len() > HISTORY_KEPT {
            let excess = self.history.len() - HISTORY_KEPT;
            self.history.drain(..excess);
        }
    }
}
