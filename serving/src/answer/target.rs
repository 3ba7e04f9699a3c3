//! The generator of a request: in-process, or on the inference rack.

use std::sync::Arc;

use crate::generator::Generator;
use crate::services::Services;

use super::AnswerError;

/// The generator of a request: in-process, or on the inference rack.
#[derive(Clone)]
pub(crate) enum Target {
    /// A bundle generator run by the in-process engine.
    Local(Arc<Generator>),
    /// A `[[remote_generators]]` entry.
    Remote(Arc<crate::remote::RemoteGenerator>),
}

impl Target {
    /// The alias clients named (the response's `model`).
    pub(crate) fn alias(&self) -> &str {
        match self {
            Target::Local(g) => &g.alias,
            Target::Remote(r) => &r.alias,
        }
    }
}

/// The generator a request names. A remote generator is kept at every rung: the local ladder
/// measures the appliance's own load (retrieval still follows its rung), the rack's own
/// admission decides when the small local model replaces the rack (see `crate::remote`).
pub(crate) fn pick_generator(
    services: &Services,
    model: Option<&str>,
    small: bool,
) -> Result<Target, AnswerError> {
    let named = match model {
        Some(m) => {
            let card = services
                .catalogue
                .iter()
                .find(|c| c.id == m)
                .ok_or_else(|| AnswerError::UnknownModel(m.to_string()))?;
            if card.role != "generator" {
                return Err(AnswerError::NotAChatModel(m.to_string()));
            }
            if let Some(r) = services.remote(m) {
                return Ok(Target::Remote(r.clone()));
            }
            services.generator(m)
        }
        None => services.default_generator(),
    };
    let chosen = if small {
        services.small_generator()
    } else {
        named
    };
    chosen
        .cloned()
        .map(Target::Local)
        .ok_or(AnswerError::NoGenerator)
}
