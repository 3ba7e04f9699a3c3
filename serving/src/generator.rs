//! A served generator: the model's own chat template and tokenizer in front of the inference
//! crate's continuous-batching [`Engine`] (which owns the model on its scheduler thread).
//!
//! Rendering and tokenizing a prompt is cheap CPU work done on the blocking pool; the forward
//! passes run on the engine thread, never on the async runtime.

use std::path::Path;
use std::sync::Arc;

use airlock_inference::generate::{
    DecoderModel, Detokenizer, Engine, EngineConfig, GenerateRequest, SamplingParams, Stream,
    SubmitError,
};
use airlock_inference::{ChatMessage, ChatTemplate, GeneratorFiles};
use tokenizers::Tokenizer;

use airlock_rag::prompt::Role;

/// One generator model, ready to take requests.
pub struct Generator {
    /// The catalogue alias clients use.
    pub alias: String,
    /// The catalogue id.
    pub model_id: String,
    /// `sha256:<hex>` of the weights file as the signed bundle pins it (named in receipts).
    pub file_digest: Option<String>,
    tokenizer: Arc<Tokenizer>,
    template: ChatTemplate,
    bos: Option<u32>,
    engine: Engine,
}

impl std::fmt::Debug for Generator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Generator")
            .field("alias", &self.alias)
            .field("model_id", &self.model_id)
            .finish_non_exhaustive()
    }
}

impl Generator {
    /// Loads the model, tokenizer and chat template and starts the engine thread.
    pub fn load(
        alias: &str,
        model_id: &str,
        files: &GeneratorFiles,
        config: EngineConfig,
    ) -> airlock_inference::Result<Self> {
        let model = DecoderModel::load(&files.gguf)?;
        let tokenizer = Arc::new(airlock_inference::tokenizer::load_plain(&files.tokenizer)?);
        let special = model.special_tokens().clone();
        let name = |id: Option<u32>| {
            id.and_then(|i| tokenizer.id_to_token(i))
                .unwrap_or_default()
        };
        let source = read_text(&files.chat_template)?;
        let template = ChatTemplate::new(model_id, &source, name(special.bos), name(special.eos))?;
        let detok_tok = tokenizer.clone();
        let detok: Detokenizer =
            Arc::new(move |ids: &[u32]| detok_tok.decode(ids, true).unwrap_or_default());
        let engine = Engine::start(model, Some(detok), config)?;
        Ok(Generator {
            alias: alias.to_string(),
            model_id: model_id.to_string(),
            file_digest: None,
            tokenizer,
            template,
            bos: special.bos.filter(|_| special.add_bos),
            engine,
        })
    }

    /// Names the weights file's digest (from the bundle manifest).
    pub fn with_file_digest(mut self, digest: String) -> Self {
        self.file_digest = Some(digest);
        self
    }

    /// Renders the conversation with the model's template and tokenizes it. Blocking (CPU).
    pub fn prompt_ids(&self, conversation: &[(Role, String)]) -> Result<Vec<u32>, PromptError> {
        Ok(self.prompt_with_digest(conversation)?.0)
    }

    /// [`Generator::prompt_ids`] and `sha256:<hex>` of the exact prompt text rendered by the
    /// chat template (what is tokenized; the receipt's `prompt_sha256`). Blocking (CPU).
    pub fn prompt_with_digest(
        &self,
        conversation: &[(Role, String)],
    ) -> Result<(Vec<u32>, String), PromptError> {
        let messages: Vec<ChatMessage> = conversation
            .iter()
            .map(|(r, t)| ChatMessage::new(r.as_str(), t.clone()))
            .collect();
        let text = self
            .template
            .render(&messages, true)
            .map_err(|e| PromptError(format!("{}: chat template: {e}", self.model_id)))?;
        let enc = self
            .tokenizer
            .encode(text.as_str(), false)
            .map_err(|e| PromptError(format!("{}: tokenizer: {e}", self.model_id)))?;
        let mut ids = Vec::with_capacity(enc.len() + 1);
        ids.extend(self.bos);
        ids.extend_from_slice(enc.get_ids());
        Ok((ids, airlock_evidence::receipts::sha256(text.as_bytes())))
    }

    /// The token ids every RAG prompt starts with: the templated fixed system prompt up to where
    /// the user's turn begins. Found as the common token prefix of two renderings that differ
    /// only in the user's text, less one token (a tokenizer may merge across the boundary), so
    /// it holds nothing but platform text, identical for every user.
    pub fn shared_prefix_ids(&self) -> Result<Vec<u32>, PromptError> {
        let render = |q: &str| {
            self.prompt_ids(&[
                (
                    Role::System,
                    airlock_rag::prompt::RAG_SYSTEM_PROMPT.to_string(),
                ),
                (Role::User, q.to_string()),
            ])
        };
        let (a, b) = (render("1")?, render("Zebra?")?);
        let common = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
        Ok(a[..common.saturating_sub(1)].to_vec())
    }

    /// Queues a generation; events arrive on the stream. Dropping the stream cancels the
    /// sequence at the engine's next step.
    pub fn submit(&self, prompt: Vec<u32>, params: SamplingParams) -> Result<Stream, SubmitError> {
        self.engine.submit(GenerateRequest { prompt, params })
    }

    /// The engine (counters, context size).
    pub fn engine(&self) -> &Engine {
        &self.engine
    }
}

fn read_text(path: &Path) -> airlock_inference::Result<String> {
    std::fs::read_to_string(path).map_err(|source| airlock_inference::Error::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// The chat template or the tokenizer failed on a prompt: the appliance's fault, never the
/// caller's.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct PromptError(pub String);
