//! `follow_up_query = "rewrite"`: the generator rewrites a follow-up into a stand-alone question
//! before retrieval (the second approach of issue 21, measured against the deterministic
//! carry-over of `airlock_rag::query`; docs/EVALS.md). Only the user's own questions go into
//! the rewrite prompt (an assistant's answer never enters retrieval), a first turn is never
//! rewritten, and a rewrite that comes back empty, over-long or not a question falls back to the
//! carry-over, so the model can only change *which* stand-alone query is searched, never what the
//! caller may read (the answer path applies the caller's ACL to whatever query it gets).

use std::time::Instant;

use airlock_inference::generate::{Event, GenerateRequest, SamplingParams};
use airlock_rag::FollowUps;
use airlock_rag::prompt::Role;

use crate::admission::Priority;
use crate::generator::Generator;

use super::AnswerError;

/// Earlier questions shown to the rewriter (the most recent ones).
pub const MAX_EARLIER_QUESTIONS: usize = 4;
/// Tokens the rewrite may generate.
pub const MAX_REWRITE_TOKENS: usize = 64;
/// A longer rewrite is refused (the carry-over is used).
pub const MAX_REWRITE_CHARS: usize = 400;

const SYSTEM: &str = "You rewrite the last question of a conversation so that it can be \
understood without the conversation. Keep its meaning; put in every name, year, product and \
subject it refers to from the earlier questions. Do not answer it. Reply with the rewritten \
question only, on one line.";

/// The conversation's retrieval query as a one-message conversation, rewritten by `generator`
/// when `how` is [`FollowUps::Rewrite`] and the question follows earlier ones; `None` when the
/// answer path should build the query itself. Also the milliseconds the rewrite took.
pub async fn rewritten(
    how: FollowUps,
    generator: &Generator,
    conversation: &[(Role, String)],
    priority: Priority,
) -> Result<Option<(Vec<(Role, String)>, f64)>, AnswerError> {
    if how != FollowUps::Rewrite {
        return Ok(None);
    }
    let users: Vec<&str> = conversation
        .iter()
        .filter(|(r, t)| *r == Role::User && !t.trim().is_empty())
        .map(|(_, t)| t.trim())
        .collect();
    let Some((&last, earlier)) = users.split_last() else {
        return Ok(None);
    };
    if earlier.is_empty() {
        return Ok(None);
    }
    let t0 = Instant::now();
    let prompt = generator.prompt_ids(&rewrite_prompt(earlier, last))?;
    let mut stream = generator
        .engine()
        .submit_with_priority(
            GenerateRequest {
                prompt,
                params: SamplingParams {
                    temperature: 0.0,
                    max_tokens: MAX_REWRITE_TOKENS,
                    stop_strings: vec!["\n".into()],
                    ..SamplingParams::default()
                },
            },
            priority.engine(),
        )
        .map_err(AnswerError::Submit)?;
    let mut text = String::new();
    while let Some(ev) = stream.recv().await {
        match ev {
            Event::Token { text: Some(t), .. } => text.push_str(&t),
            Event::Done { text: tail, .. } => {
                text.push_str(tail.as_deref().unwrap_or_default());
                break;
            }
            _ => {}
        }
    }
    let ms = t0.elapsed().as_secs_f64() * 1000.0;
    let query = match clean(&text) {
        Some(q) => q,
        None => airlock_rag::query::retrieval_query(conversation, FollowUps::Carry),
    };
    Ok(Some((vec![(Role::User, query)], ms)))
}

/// The rewrite prompt: the instruction, the most recent earlier questions and the follow-up.
pub fn rewrite_prompt(earlier: &[&str], last: &str) -> Vec<(Role, String)> {
    let from = earlier.len().saturating_sub(MAX_EARLIER_QUESTIONS);
    let mut user = String::from("Earlier questions:\n");
    for (i, q) in earlier[from..].iter().enumerate() {
        user.push_str(&format!("{}. {}\n", i + 1, one_line(q)));
    }
    user.push_str(&format!(
        "Last question: {}\nRewritten last question:",
        one_line(last)
    ));
    vec![(Role::System, SYSTEM.to_string()), (Role::User, user)]
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The model's rewrite, trimmed of labels and quotes; `None` when unusable.
pub fn clean(raw: &str) -> Option<String> {
    let mut s = raw.lines().find(|l| !l.trim().is_empty())?.trim();
    for label in [
        "Rewritten last question:",
        "Rewritten question:",
        "Question:",
    ] {
        if let Some(rest) = s.strip_prefix(label) {
            s = rest.trim();
        }
    }
    let s = s.trim_matches(|c| c == '"' || c == '\'' || c == '`').trim();
    let words = s.split_whitespace().count();
    if words < 2 || s.chars().count() > MAX_REWRITE_CHARS {
        return None;
    }
    Some(s.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clean_strips_labels_and_quotes_and_refuses_junk() {
        assert_eq!(
            clean("Rewritten question: \"What is the tenor of the Fairhaven facility?\"\n"),
            Some("What is the tenor of the Fairhaven facility?".into())
        );
        assert_eq!(
            clean("\n\n  What about X in 2025?  "),
            Some("What about X in 2025?".into())
        );
        assert_eq!(clean(""), None);
        assert_eq!(clean("   \n "), None);
        assert_eq!(clean("Yes"), None);
        assert_eq!(clean(&"word ".repeat(200)), None);
    }

    #[test]
    fn the_prompt_holds_only_the_most_recent_user_questions() {
        let earlier = ["q1 a", "q2 b", "q3 c", "q4 d", "q5 e"];
        let p = rewrite_prompt(&earlier, "And  for\nY?");
        assert_eq!(p.len(), 2);
        assert_eq!(p[0].0, Role::System);
        let user = &p[1].1;
        assert!(!user.contains("q1 a"), "{user}");
        assert!(
            user.contains("1. q2 b") && user.contains("4. q5 e"),
            "{user}"
        );
        assert!(user.ends_with("Last question: And for Y?\nRewritten last question:"));
    }
}
