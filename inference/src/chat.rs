//! Chat templates: the Jinja template a model ships (`tokenizer.chat_template` in GGUF metadata)
//! rendered with minijinja, configured like Hugging Face's renderer (`trim_blocks`,
//! `lstrip_blocks`, `raise_exception`, `tojson`), so the prompt string is the model's own format
//! and not hand-written glue.

use minijinja::{Environment, ErrorKind, context};

use crate::error::{Error, Result};

/// One chat message.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ChatMessage {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// The text.
    pub content: String,
}

impl ChatMessage {
    /// A message with `role` and `content`.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    model: String,
    bos_token: String,
    eos_token: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("model", &self.model)
            .finish_non_exhaustive()
    }
}

const NAME: &str = "chat";

impl ChatTemplate {
    /// Compiles `source` (Jinja). `bos_token`/`eos_token` are exposed to the template as in
    /// Hugging Face's renderer (both ChatML templates here ignore them).
    pub fn new(
        model: &str,
        source: &str,
        bos_token: impl Into<String>,
        eos_token: impl Into<String>,
    ) -> Result<Self> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.add_function(
            "raise_exception",
            |msg: String| -> Result<String, minijinja::Error> {
                Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
            },
        );
        env.add_template_owned(NAME, source.to_string())
            .map_err(|e| Error::Template {
                model: model.to_string(),
                reason: format!("does not compile: {e:#}"),
            })?;
        Ok(Self {
            env,
            model: model.to_string(),
            bos_token: bos_token.into(),
            eos_token: eos_token.into(),
        })
    }

    /// Renders `messages`; with `add_generation_prompt` the string ends where the assistant's
    /// answer starts (`<|im_start|>assistant\n` for ChatML).
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        let tmpl = self.env.get_template(NAME).map_err(|e| self.err(e))?;
        tmpl.render(context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => &self.bos_token,
            eos_token => &self.eos_token,
        })
        .map_err(|e| self.err(e))
    }

    fn err(&self, e: minijinja::Error) -> Error {
        Error::Template {
            model: self.model.clone(),
            reason: format!("{e:#}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_loops_and_raises() {
        let t = ChatTemplate::new(
            "t",
            "{% for m in messages %}{% if m.role == 'bad' %}{{ raise_exception('no ' + m.role) }}{% endif %}[{{ m.role }}:{{ m.content }}]{% endfor %}{% if add_generation_prompt %}>{% endif %}",
            "<s>",
            "</s>",
        )
        .unwrap();
        let msgs = [
            ChatMessage::new("system", "s"),
            ChatMessage::new("user", "u"),
        ];
        assert_eq!(t.render(&msgs, true).unwrap(), "[system:s][user:u]>");
        assert_eq!(t.render(&msgs, false).unwrap(), "[system:s][user:u]");
        let err = t.render(&[ChatMessage::new("bad", "x")], true).unwrap_err();
        assert!(err.to_string().contains("no bad"), "{err}");
        assert!(ChatTemplate::new("t", "{% if %}", "", "").is_err());
    }
}
