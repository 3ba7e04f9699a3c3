//! Writing a chat answer's receipt (see [`airlock_evidence::receipts`] for what it holds and when each
//! entry is written): the `served` entry before the answer's first byte, the `completed` entry
//! before the answer is acknowledged as complete. A receipt that cannot be written refuses the
//! answer (`503 receipt-unrecorded`).

use std::sync::Arc;

use airlock_acl::Acl;
use airlock_evidence::receipts::{BundleRef, Completed, ModelRef, Served, sha256};
use airlock_rag::{CitedBy, Role};

use super::prepare::Prepared;
use super::target::Target;
use super::{AnswerError, log_target};
use crate::services::Services;

/// The `served` entry of an answer prepared as `prepared` (`no_source`: the abstention, whose
/// entry is also its completion).
pub(crate) fn served(
    services: &Services,
    receipt_id: &str,
    prepared: &Prepared,
    no_source: bool,
) -> Served {
    Served {
        receipt_id: receipt_id.to_string(),
        phase: "served".into(),
        bundle: BundleRef {
            version: services.bundle_version().to_string(),
            digest: services.bundle_digest().map(str::to_owned),
        },
        model: model_ref(&prepared.target),
        index_generation: prepared.index_generation,
        acl_state_seq: prepared.acl_state_seq,
        prompt_sha256: (!no_source).then(|| prepared.prompt_sha256.clone()),
        shown: prepared.shown.clone(),
        cited: no_source.then(Vec::new),
        cited_by: no_source
            .then(|| cited_by_name(CitedBy::NoSource))
            .flatten(),
    }
}

/// The receipt's model: the generator the answer is routed to.
pub(crate) fn model_ref(target: &Target) -> ModelRef {
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
pub(crate) fn messages_digest(messages: &[(Role, String)]) -> String {
    let v: Vec<serde_json::Value> = messages
        .iter()
        .map(|(r, t)| serde_json::json!({"role": r.as_str(), "content": t}))
        .collect();
    sha256(serde_json::to_string(&v).unwrap_or_default().as_bytes())
}

/// The snake_case name of `by`.
pub(crate) fn cited_by_name(by: CitedBy) -> Option<String> {
    serde_json::to_value(by)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
}

fn unrecorded(e: impl std::fmt::Display) -> AnswerError {
    tracing::error!(target: log_target::RECEIPT, error = %e, "receipt not recorded: the answer is refused");
    AnswerError::ReceiptUnrecorded(e.to_string())
}

/// Appends the `served` entry (on the blocking pool).
pub(crate) async fn open(
    acl: &Arc<Acl>,
    request_id: &str,
    user_id: &str,
    served: &Served,
) -> Result<(), AnswerError> {
    let detail = serde_json::to_value(served).map_err(unrecorded)?;
    let (acl, rid, user) = (acl.clone(), request_id.to_string(), user_id.to_string());
    tokio::task::spawn_blocking(move || acl.audit_receipt(&rid, &user, detail))
        .await
        .map_err(unrecorded)?
        .map_err(unrecorded)?;
    Ok(())
}

/// Closes a receipt when its generation ends.
pub struct Closer {
    pub(crate) acl: Arc<Acl>,
    pub(crate) receipt_id: String,
    pub(crate) request_id: String,
    pub(crate) user_id: String,
}

impl Closer {
    /// Appends the `completed` entry (on the blocking pool).
    pub async fn close(
        self,
        cited: &[usize],
        cited_by: Option<CitedBy>,
        finish: &str,
    ) -> Result<(), AnswerError> {
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
