//! The engine's own load, where it exposes one: its Prometheus `/metrics` (vLLM
//! `vllm:num_requests_waiting` / `vllm:num_requests_running`, native llama.cpp `llama-server
//! --metrics` `llamacpp:requests_deferred` / `llamacpp:requests_processing`), scraped from each
//! replica's own `host:port` (no new endpoint for the egress allowlist). A replica whose engine
//! reports more waiting requests than `engine_waiting_full` counts as full for admission, like
//! one at its in-flight cap. A scrape that fails or goes stale leaves admission to Airlock's own
//! signals (in-flight count, TTFT).
//!
//! The text is outside data: [`parse`] takes any bytes (fuzz target `rack_metrics`) and reads
//! only the two series it is asked for.

/// Which engine's metric names to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineKind {
    /// vLLM (and llm-d's vLLM pods).
    Vllm,
    /// llama.cpp's `llama-server --metrics`.
    LlamaCpp,
}

impl EngineKind {
    /// The config value.
    pub fn parse(v: &str) -> Option<Option<EngineKind>> {
        match v {
            "vllm" => Some(Some(EngineKind::Vllm)),
            "llamacpp" => Some(Some(EngineKind::LlamaCpp)),
            "none" => Some(None),
            _ => None,
        }
    }

    /// The config value of this kind.
    pub fn name(self) -> &'static str {
        match self {
            EngineKind::Vllm => "vllm",
            EngineKind::LlamaCpp => "llamacpp",
        }
    }

    /// The series of requests waiting in the engine's queue.
    pub fn waiting_metric(self) -> &'static str {
        match self {
            EngineKind::Vllm => "vllm:num_requests_waiting",
            EngineKind::LlamaCpp => "llamacpp:requests_deferred",
        }
    }

    /// The series of requests the engine is running.
    pub fn running_metric(self) -> &'static str {
        match self {
            EngineKind::Vllm => "vllm:num_requests_running",
            EngineKind::LlamaCpp => "llamacpp:requests_processing",
        }
    }

    /// The label naming the served model, where the engine sets one.
    pub fn model_label(self) -> Option<&'static str> {
        match self {
            EngineKind::Vllm => Some("model_name"),
            EngineKind::LlamaCpp => None,
        }
    }
}

/// What one scrape says.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EngineLoad {
    /// Requests waiting in the engine's queue.
    pub waiting: f64,
    /// Requests the engine is running (absent from the text: `None`).
    pub running: Option<f64>,
}

/// Reads `kind`'s waiting and running series from a Prometheus text exposition, summed over
/// the series whose model label (if the engine sets one and the series has it) is `model`.
/// `None` when the waiting series is absent. Lines that do not parse are skipped; values that
/// are not finite and non-negative are ignored.
pub fn parse(text: &[u8], kind: EngineKind, model: &str) -> Option<EngineLoad> {
    let text = String::from_utf8_lossy(text);
    let (mut waiting, mut running) = (None::<f64>, None::<f64>);
    for line in text.lines() {
        let Some(s) = sample(line) else { continue };
        let slot = if s.name == kind.waiting_metric() {
            &mut waiting
        } else if s.name == kind.running_metric() {
            &mut running
        } else {
            continue;
        };
        if let Some(label) = kind.model_label()
            && let Some(m) = s.label(label)
            && m != model
        {
            continue;
        }
        if !(s.value.is_finite() && s.value >= 0.0) {
            continue;
        }
        *slot = Some(slot.unwrap_or(0.0) + s.value);
    }
    waiting.map(|waiting| EngineLoad { waiting, running })
}

/// One sample line: `name{labels} value [timestamp]`.
#[derive(Debug)]
struct Sample<'a> {
    name: &'a str,
    labels: Vec<(&'a str, String)>,
    value: f64,
}

impl Sample<'_> {
    fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| v.as_str())
    }
}

fn sample(line: &str) -> Option<Sample<'_>> {
    let line = line.trim_start();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let name_end = line
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .unwrap_or(line.len());
    let name = &line[..name_end];
    if name.is_empty() || name.starts_with(|c: char| c.is_ascii_digit()) {
        return None;
    }
    let mut rest = &line[name_end..];
    let mut labels = Vec::new();
    if let Some(r) = rest.strip_prefix('{') {
        let (parsed, after) = label_set(r)?;
        labels = parsed;
        rest = after;
    }
    // The value must follow whitespace (a name like `a b` is not one sample).
    if !rest.starts_with([' ', '\t']) {
        return None;
    }
    let mut fields = rest.split_ascii_whitespace();
    let value = match fields.next()? {
        "+Inf" | "Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        "NaN" => f64::NAN,
        v => v.parse().ok()?,
    };
    // An optional integer timestamp, then nothing.
    if let Some(ts) = fields.next() {
        ts.parse::<i64>().ok()?;
    }
    if fields.next().is_some() {
        return None;
    }
    Some(Sample {
        name,
        labels,
        value,
    })
}

/// `k="v",k2="v2"}` → the labels and what follows the closing brace.
#[allow(clippy::type_complexity)]
fn label_set(mut s: &str) -> Option<(Vec<(&str, String)>, &str)> {
    let mut labels = Vec::new();
    loop {
        s = s.trim_start();
        if let Some(after) = s.strip_prefix('}') {
            return Some((labels, after));
        }
        let eq = s.find('=')?;
        let key = s[..eq].trim();
        if key.is_empty() || !key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return None;
        }
        s = s[eq + 1..].trim_start().strip_prefix('"')?;
        let mut value = String::new();
        let mut chars = s.char_indices();
        let end = loop {
            let (i, c) = chars.next()?;
            match c {
                '"' => break i,
                '\\' => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    other => value.push(other),
                },
                c => value.push(c),
            }
        };
        labels.push((key, value));
        s = s[end + 1..].trim_start();
        if let Some(after) = s.strip_prefix(',') {
            s = after;
        } else if !s.starts_with('}') {
            return None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lines as vLLM 0.6-0.8 writes them (names, HELP/TYPE, labels).
    const VLLM: &str = r#"# HELP vllm:num_requests_running Number of requests currently running on GPU.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="qwen2.5-7b-instruct"} 12.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="qwen2.5-7b-instruct"} 3.0
vllm:num_requests_waiting{model_name="other-model"} 40.0
vllm:num_requests_waiting_total{model_name="qwen2.5-7b-instruct"} 99
vllm:time_to_first_token_seconds_bucket{le="0.001",model_name="qwen2.5-7b-instruct"} 0.0
"#;

    #[test]
    fn vllm_series_of_the_model_are_read() {
        let l = parse(VLLM.as_bytes(), EngineKind::Vllm, "qwen2.5-7b-instruct").unwrap();
        assert_eq!(
            l,
            EngineLoad {
                waiting: 3.0,
                running: Some(12.0)
            }
        );
        // Another model's series are not this one's load.
        let l = parse(VLLM.as_bytes(), EngineKind::Vllm, "other-model").unwrap();
        assert_eq!(l.waiting, 40.0);
        assert_eq!(l.running, None);
    }

    #[test]
    fn llamacpp_series_are_read_and_absence_is_none() {
        let text = "# TYPE llamacpp:requests_processing gauge\nllamacpp:requests_processing 2\n\
                    llamacpp:requests_deferred 5 1700000000000\n";
        let l = parse(text.as_bytes(), EngineKind::LlamaCpp, "x").unwrap();
        assert_eq!((l.waiting, l.running), (5.0, Some(2.0)));
        assert_eq!(parse(text.as_bytes(), EngineKind::Vllm, "x"), None);
        assert_eq!(parse(b"", EngineKind::LlamaCpp, "x"), None);
    }

    #[test]
    fn bad_lines_and_values_are_skipped() {
        let text = "llamacpp:requests_deferred{a=\"x\\\"}\"} 1\n\
                    llamacpp:requests_deferred{broken 7\n\
                    llamacpp:requests_deferred NaN\n\
                    llamacpp:requests_deferred -3\n\
                    llamacpp:requests_deferred 2 3 4\n\
                    llamacpp:requests_deferredx 100\n\
                    llamacpp:requests_deferred\t2\n";
        let l = parse(text.as_bytes(), EngineKind::LlamaCpp, "x").unwrap();
        assert_eq!(l.waiting, 3.0);
    }
}
