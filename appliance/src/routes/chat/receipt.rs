//! Writing a chat answer's receipt (see [`airlock_evidence::receipts`] for what it holds and when each
//! entry is written): the `served` entry before the answer's first byte, the `completed` entry
//! before the answer is acknowledged as complete. A receipt that cannot be written refuses the
//! answer (`503 receipt-unrecorded`).

use std::sync::Arc;

use airlock_acl::Acl;
use airlock_evidence::receipts::{Completed, ModelRef, Served, sha256};
use airlock_rag::{CitedBy, Role};

use crate::error::ApiError;

use super::request::Target;

/// The receipt's model: the generator the answer is routed to.
pub(super) fn model_ref(target: &Target) -> ModelRef {
    match target {
        Target::Local(g) => ModelRef {
            alias: g.alias.clone(),
            model_id: g.model_id.clone(),
            file_digest: g.file_digest.clone(),
            served_by: "local".into(),
        },
        Target::Remote(r) => ModelRef {
            alias: r.alias.clone(),
            model_id: r.config.model.clone(),
            file_digest: None,
            served_by: "rack".into(),
        },
    }
}

/// `sha256:<hex>` of the messages a rack generator is sent: the compact JSON array of
/// `{"role", "content"}` objects, in order.
pub(super) fn messages_digest(messages: &[(Role, String)]) -> String {
    let v: Vec<serde_json::Value> = messages
        .iter()
        .map(|(r, t)| serde_json::json!({"role": r.as_str(), "content": t}))
        .collect();
    sha256(serde_json::to_string(&v).unwrap_or_default().as_bytes())
}

/// The snake_case name of `by`.
pub(super) fn cited_by_name(by: CitedBy) -> Option<String> {
    serde_json::to_value(by)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
}

fn unrecorded(e: impl std::fmt::Display) -> ApiError {
    tracing::error!(error = %e, "receipt not recorded: the answer is refused");
    ApiError::ReceiptUnrecorded(e.to_string())
}

/// Appends the `served` entry (on the blocking pool).
pub(super) async fn open(
    acl: &Arc<Acl>,
    request_id: &str,
    user_id: &str,
    served: &Served,
) -> Result<(), ApiError> {
    let detail = serde_json::to_value(served).map_err(unrecorded)?;
    let (acl, rid, user) = (acl.clone(), request_id.to_string(), user_id.to_string());
    tokio::task::spawn_blocking(move || acl.audit_receipt(&rid, &user, detail))
        .await
        .map_err(unrecorded)?
        .map_err(unrecorded)?;
    Ok(())
}

/// Closes a receipt when its generation ends.
pub(super) struct Closer {
    pub(super) acl: Arc<Acl>,
    pub(super) receipt_id: String,
    pub(super) request_id: String,
    pub(super) user_id: String,
}

impl Closer {
    /// Appends the `completed` entry (on the blocking pool).
    pub(super) async fn close(
        self,
        cited: &[usize],
        cited_by: Option<CitedBy>,
        finish: &str,
    ) -> Result<(), ApiError> {
        let detail = serde_json::to_value(Completed {
            receipt_id: self.receipt_id,
            phase: "completed".into(),
            cited: cited.to_vec(),
            cited_by: cited_by.and_then(cited_by_name),
            finish: finish.to_string(),
        })
        .map_err(unrecorded)?;
        let Closer {
            acl,
            request_id,
            user_id,
            ..
        } = self;
        tokio::task::spawn_blocking(move || acl.audit_receipt(&request_id, &user_id, detail))
            .await
            .map_err(unrecorded)?
            .map_err(unrecorded)?;
        Ok(())
    }
}
