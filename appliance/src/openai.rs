//! OpenAI-compatible wire types (requests ignore unknown fields: clients send extras) and the
//! `airlock` extensions of API.md.

use airlock_serving::answer::{Citation, Timings};
use serde::{Deserialize, Serialize};

/// One chat message. `content` may be a string or an array of text parts.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant` (others are accepted and treated as `user`).
    pub role: String,
    /// The text.
    #[serde(default, deserialize_with = "content_text")]
    pub content: String,
}

fn content_text<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Content {
        Text(String),
        Parts(Vec<Part>),
        Null(()),
    }
    #[derive(Deserialize)]
    struct Part {
        #[serde(default)]
        text: Option<String>,
    }
    Ok(match Content::deserialize(d)? {
        Content::Text(s) => s,
        Content::Parts(p) => p
            .into_iter()
            .filter_map(|p| p.text)
            .collect::<Vec<_>>()
            .join("\n"),
        Content::Null(()) => String::new(),
    })
}

/// `stop`: a string or a list of strings.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    /// One stop string.
    One(String),
    /// Several.
    Many(Vec<String>),
}

impl Stop {
    /// As a list.
    pub fn into_vec(self) -> Vec<String> {
        match self {
            Stop::One(s) => vec![s],
            Stop::Many(v) => v,
        }
    }
}

/// The `airlock` request extension.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AirlockRequest {
    /// Whether retrieval runs (default true); false = plain chat.
    #[serde(default = "yes")]
    pub retrieval: bool,
    /// Chunks placed in the prompt (default from config).
    #[serde(default)]
    pub top_k: Option<usize>,
    /// Forces a ladder rung (admin only).
    #[serde(default)]
    pub rung: Option<u8>,
    /// A server-kept thread of the caller (`/v1/conversations`): its readable turns come
    /// before `messages`, and the answer is added to it as a new turn.
    #[serde(default)]
    pub conversation_id: Option<String>,
    /// Send the full text of each prompt source with a non-streaming answer
    /// (`airlock.source_texts`), for clients that check an answer against its sources (the
    /// eval's invented-value rate). The caller may read every one of them: they are the chunks
    /// placed in its own prompt. Never stored with a conversation turn.
    #[serde(default)]
    pub source_text: bool,
}

fn yes() -> bool {
    true
}

impl Default for AirlockRequest {
    fn default() -> Self {
        AirlockRequest {
            retrieval: true,
            top_k: None,
            rung: None,
            conversation_id: None,
            source_text: false,
        }
    }
}

/// `POST /v1/chat/completions` body.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatRequest {
    /// `airlock-large` (default), `airlock-small`, or another catalogue alias.
    #[serde(default)]
    pub model: Option<String>,
    /// The conversation.
    pub messages: Vec<ChatMessage>,
    /// SSE streaming.
    #[serde(default)]
    pub stream: bool,
    /// Completion length cap.
    #[serde(default)]
    pub max_tokens: Option<u32>,
    /// Newer clients send this instead of `max_tokens`.
    #[serde(default)]
    pub max_completion_tokens: Option<u32>,
    /// Sampling temperature (0 = greedy).
    #[serde(default)]
    pub temperature: Option<f32>,
    /// Nucleus sampling.
    #[serde(default)]
    pub top_p: Option<f32>,
    /// Sampling seed.
    #[serde(default)]
    pub seed: Option<u64>,
    /// Stop strings.
    #[serde(default)]
    pub stop: Option<Stop>,
    /// Extensions.
    #[serde(default)]
    pub airlock: Option<AirlockRequest>,
    /// Streaming options: `include_usage` adds a last chunk with the usage and no choices.
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
    /// Fields of OpenAI's API the daemon does not implement: accepted by the parser only to
    /// be refused by name (`unsupported-parameter`) instead of being silently ignored.
    #[serde(flatten)]
    pub unsupported: Unsupported,
}

/// `stream_options`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct StreamOptions {
    /// Send a final chunk with `usage` (and empty `choices`) before `[DONE]`.
    #[serde(default)]
    pub include_usage: bool,
}

/// OpenAI request fields that are refused when they ask for something not implemented.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Unsupported {
    /// Tool calling.
    #[serde(default)]
    pub tools: Option<serde_json::Value>,
    /// Tool choice.
    #[serde(default)]
    pub tool_choice: Option<serde_json::Value>,
    /// Legacy function calling.
    #[serde(default)]
    pub functions: Option<serde_json::Value>,
    /// Legacy function choice.
    #[serde(default)]
    pub function_call: Option<serde_json::Value>,
    /// Structured output (`{"type": "text"}` is what the daemon does anyway and is accepted).
    #[serde(default)]
    pub response_format: Option<serde_json::Value>,
    /// Several choices per request (1 is accepted).
    #[serde(default)]
    pub n: Option<serde_json::Value>,
    /// Token log-probabilities (`false` is accepted).
    #[serde(default)]
    pub logprobs: Option<serde_json::Value>,
    /// Top log-probabilities.
    #[serde(default)]
    pub top_logprobs: Option<serde_json::Value>,
    /// Token biases.
    #[serde(default)]
    pub logit_bias: Option<serde_json::Value>,
    /// Audio output.
    #[serde(default)]
    pub audio: Option<serde_json::Value>,
    /// Output modalities other than text.
    #[serde(default)]
    pub modalities: Option<serde_json::Value>,
    /// Predicted outputs.
    #[serde(default)]
    pub prediction: Option<serde_json::Value>,
}

impl Unsupported {
    /// The first field that asks for something not implemented.
    pub fn refused(&self) -> Option<(&'static str, &'static str)> {
        use serde_json::Value;
        let set = |v: &Option<Value>| v.as_ref().is_some_and(|v| !v.is_null());
        if set(&self.tools) {
            return Some(("tools", "; tool calling is not implemented"));
        }
        if set(&self.tool_choice) && self.tool_choice.as_ref() != Some(&Value::from("none")) {
            return Some(("tool_choice", "; tool calling is not implemented"));
        }
        if set(&self.functions) {
            return Some(("functions", "; function calling is not implemented"));
        }
        if set(&self.function_call) && self.function_call.as_ref() != Some(&Value::from("none")) {
            return Some(("function_call", "; function calling is not implemented"));
        }
        if let Some(f) = self.response_format.as_ref().filter(|v| !v.is_null())
            && f.get("type").and_then(Value::as_str) != Some("text")
        {
            return Some((
                "response_format",
                "; only {\"type\": \"text\"} is supported",
            ));
        }
        if let Some(n) = self.n.as_ref().filter(|v| !v.is_null())
            && n.as_u64() != Some(1)
        {
            return Some(("n", "; one choice per request (n = 1)"));
        }
        if let Some(l) = self.logprobs.as_ref().filter(|v| !v.is_null())
            && l.as_bool() != Some(false)
        {
            return Some(("logprobs", ""));
        }
        if set(&self.top_logprobs) {
            return Some(("top_logprobs", ""));
        }
        if let Some(b) = self.logit_bias.as_ref().filter(|v| !v.is_null())
            && b.as_object().is_none_or(|o| !o.is_empty())
        {
            return Some(("logit_bias", ""));
        }
        if set(&self.audio) {
            return Some(("audio", "; text only"));
        }
        if let Some(m) = self.modalities.as_ref().filter(|v| !v.is_null())
            && m.as_array()
                .is_none_or(|a| a.iter().any(|x| x.as_str() != Some("text")))
        {
            return Some(("modalities", "; text only"));
        }
        if set(&self.prediction) {
            return Some(("prediction", ""));
        }
        None
    }
}

/// The `airlock` response extension.
#[derive(Debug, Clone, Serialize)]
pub struct AirlockResponse {
    /// The chunks in the prompt.
    pub citations: Vec<Citation>,
    /// The rung that served the request.
    pub rung: u8,
    /// The installed bundle.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bundle_version: Option<String>,
    /// Milliseconds per stage (non-streaming responses to admins only:
    /// [`crate::Config::shows_stage_timings`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timings_ms: Option<Timings>,
    /// The source numbers (`n`) the answer used (non-streaming responses with retrieval; a
    /// stream sends them on its last event): see [`crate::cite`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cited: Option<Vec<usize>>,
    /// How `cited` was found: `markers` (the answer's `[n]`), `support` (word overlap),
    /// `unsupported` (no source supports the answer's own words) or `no_source`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cited_by: Option<airlock_rag::cite::CitedBy>,
    /// The answer's receipt (`GET /v1/receipts/{id}`, auditor role): on every chat answer (a
    /// stream sends it on its first event).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub receipt_id: Option<String>,
    /// The full text of each citation's chunk, in citation order (non-streaming responses
    /// that asked for them with `airlock.source_text`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source_texts: Option<Vec<String>>,
}

/// The `airlock` extension of an SSE event: the citations and rung on the first event, the
/// sources the answer used on the last one.
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum ChunkAirlock {
    /// First event.
    Start(Box<AirlockResponse>),
    /// Last event (the one with the finish reason), with retrieval.
    End {
        /// The source numbers the answer used.
        cited: Vec<usize>,
        /// How they were found.
        cited_by: airlock_rag::cite::CitedBy,
        /// The cited sources' excerpts around the sentences that support the finished answer
        /// (they replace the first event's question-based `snippet` and `passage` of the same
        /// `n`); absent when there are none.
        #[serde(skip_serializing_if = "Vec::is_empty")]
        passages: Vec<PassageUpdate>,
    },
}

/// A citation's excerpt once the answer is complete (a stream's last event).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PassageUpdate {
    /// The citation's source number.
    pub n: usize,
    /// The excerpt around the passage.
    pub snippet: String,
    /// The supporting sentence(s), a substring of `snippet`.
    pub passage: String,
}

/// Token counts.
#[derive(Debug, Clone, Copy, Serialize, Default)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Generated tokens.
    pub completion_tokens: usize,
    /// Sum.
    pub total_tokens: usize,
}

/// An assistant message in a response.
#[derive(Debug, Clone, Serialize)]
pub struct AssistantMessage {
    /// Always `assistant`.
    pub role: &'static str,
    /// The answer.
    pub content: String,
}

/// One choice of a non-streaming response.
#[derive(Debug, Clone, Serialize)]
pub struct Choice {
    /// Always 0.
    pub index: u32,
    /// The answer.
    pub message: AssistantMessage,
    /// `stop` or `length`.
    pub finish_reason: &'static str,
}

/// Non-streaming chat completion.
#[derive(Debug, Clone, Serialize)]
pub struct ChatResponse {
    /// `chatcmpl-<uuid>`.
    pub id: String,
    /// `chat.completion`.
    pub object: &'static str,
    /// Unix seconds.
    pub created: u64,
    /// The model alias that served it.
    pub model: String,
    /// One choice.
    pub choices: Vec<Choice>,
    /// Token counts.
    pub usage: Usage,
    /// Extensions.
    pub airlock: AirlockResponse,
}

impl ChatResponse {
    /// A `chat.completion` with one assistant choice, created now.
    pub fn answer(
        id: String,
        model: String,
        content: String,
        finish_reason: &'static str,
        usage: Usage,
        airlock: AirlockResponse,
    ) -> Self {
        ChatResponse {
            id,
            object: "chat.completion",
            created: unix_now(),
            model,
            choices: vec![Choice {
                index: 0,
                message: AssistantMessage {
                    role: "assistant",
                    content,
                },
                finish_reason,
            }],
            usage,
            airlock,
        }
    }
}

/// A streaming delta.
#[derive(Debug, Clone, Serialize, Default)]
pub struct Delta {
    /// Only in the first event.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    /// New text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
}

/// One choice of a streaming chunk.
#[derive(Debug, Clone, Serialize)]
pub struct ChunkChoice {
    /// Always 0.
    pub index: u32,
    /// New text.
    pub delta: Delta,
    /// Set on the last event.
    pub finish_reason: Option<&'static str>,
}

/// A `chat.completion.chunk` event.
#[derive(Debug, Clone, Serialize)]
pub struct ChatChunk {
    /// Same id on every event of one completion.
    pub id: String,
    /// `chat.completion.chunk`.
    pub object: &'static str,
    /// Unix seconds.
    pub created: u64,
    /// The model alias.
    pub model: String,
    /// One choice.
    pub choices: Vec<ChunkChoice>,
    /// On the first event (citations, rung) and, with retrieval, the last (cited sources).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub airlock: Option<ChunkAirlock>,
    /// Only on the last event.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

/// `input` of `/v1/embeddings`.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum EmbeddingInput {
    /// One text.
    One(String),
    /// Several texts.
    Many(Vec<String>),
}

/// `POST /v1/embeddings` body.
#[derive(Debug, Clone, Deserialize)]
pub struct EmbeddingsRequest {
    /// Ignored beyond validation (the bundle has one embedder); optional.
    #[serde(default)]
    pub model: Option<String>,
    /// Text(s) to embed.
    pub input: EmbeddingInput,
    /// `float` (default) or `base64`.
    #[serde(default)]
    pub encoding_format: Option<String>,
}

/// Unix seconds now.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_request_accepts_extras_and_content_parts() {
        let r: ChatRequest = serde_json::from_str(
            r#"{"model":"airlock-small","messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}],
                "stream":true,"n":1,"user":"x","stop":"END","airlock":{"retrieval":false}}"#,
        )
        .unwrap();
        assert_eq!(r.messages[0].content, "hi");
        assert!(r.stream);
        assert!(!r.airlock.unwrap().retrieval);
        assert_eq!(r.stop.unwrap().into_vec(), vec!["END".to_string()]);
    }

    #[test]
    fn airlock_extension_rejects_unknown_fields() {
        let r =
            serde_json::from_str::<ChatRequest>(r#"{"messages":[],"airlock":{"retreival":false}}"#);
        assert!(r.is_err());
    }
}
