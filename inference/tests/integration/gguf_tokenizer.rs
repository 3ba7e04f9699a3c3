//! Tokenizers rebuilt from GGUF metadata and chat templates rendered from it, against
//! llama.cpp's tokenization and formatting in the greedy fixtures.

use airlock_inference::chat::{ChatMessage, ChatTemplate};
use airlock_inference::tokenizer::gguf::{GgufTokenizerInfo, compile_from_file};
use tokenizers::Tokenizer;

use crate::common::{models_dir, read_jsonl};

fn compiled(model: &str) -> (Tokenizer, GgufTokenizerInfo) {
    let (json, info) = compile_from_file(&models_dir().join(model).join("model.gguf")).unwrap();
    // Round-trip through the serialised artifact, as the daemon loads it.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokenizer.json");
    std::fs::write(&path, json).unwrap();
    let tok = airlock_inference::tokenizer::load_plain(&path).unwrap();
    (tok, info)
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    serde_json::from_value(v.clone()).unwrap()
}

fn check_fixture(model: &str, fixture: &str) {
    let (tok, info) = compiled(model);
    let lines = read_jsonl(fixture);
    assert_eq!(lines.len(), 6);
    for (i, l) in lines.iter().enumerate() {
        let prompt = l["formatted_prompt"].as_str().unwrap();
        let enc = tok.encode(prompt, true).unwrap();
        assert_eq!(
            enc.get_ids(),
            ids(&l["prompt_token_ids"]),
            "{model} line {}",
            i + 1
        );
        let generated = ids(&l["generated_token_ids"]);
        let text = tok.decode(&generated, true).unwrap();
        assert_eq!(
            text,
            l["text"].as_str().unwrap(),
            "{model} line {} decode",
            i + 1
        );
        if generated.len() < 32 {
            let last = *generated.last().unwrap();
            assert!(
                info.end_of_generation_ids.contains(&last),
                "{model}: {last} ends generation"
            );
        }
    }
}

fn check_templates(model: &str, fixture: &str, vocab: usize) {
    let (_, info) = compiled(model);
    assert_eq!(info.vocab_size, vocab);
    assert!(!info.add_bos_token);
    let template =
        ChatTemplate::new(model, info.chat_template.as_deref().unwrap(), "", "").unwrap();
    let mut chat_lines = 0;
    for l in read_jsonl(fixture) {
        if !l["chat"].as_bool().unwrap() {
            continue;
        }
        chat_lines += 1;
        let msgs = [
            ChatMessage::new("system", l["system"].as_str().unwrap()),
            ChatMessage::new("user", l["prompt"].as_str().unwrap()),
        ];
        let rendered = template.render(&msgs, true).unwrap();
        assert_eq!(rendered, l["formatted_prompt"].as_str().unwrap(), "{model}");
    }
    assert_eq!(chat_lines, 3);
}

#[test]
fn smollm2_tokenizer_matches_llama_cpp() {
    check_fixture("smollm2", "smollm2-greedy.jsonl");
}

#[test]
fn qwen_tokenizer_matches_llama_cpp() {
    check_fixture("qwen", "qwen-coder-greedy.jsonl");
}

#[test]
fn smollm2_chat_template_matches_llama_cpp() {
    check_templates("smollm2", "smollm2-greedy.jsonl", 49152);
}

#[test]
fn qwen_chat_template_matches_llama_cpp() {
    check_templates("qwen", "qwen-coder-greedy.jsonl", 151936);
}

#[test]
fn special_tokens_and_digits() {
    let (tok, info) = compiled("smollm2");
    assert_eq!(info.eos_token_id, Some(2));
    assert!(info.end_of_generation_ids.contains(&2));
    // control tokens are atomic; digits split one by one (llama.cpp `smollm`)
    let enc = tok.encode("<|im_start|>user 2024", true).unwrap();
    assert_eq!(enc.get_ids()[0], 1);
    let toks = enc.get_tokens();
    assert!(
        toks.ends_with(&["2".into(), "0".into(), "2".into(), "4".into()]),
        "{toks:?}"
    );
    let (qtok, qinfo) = compiled("qwen");
    assert_eq!(qinfo.eos_token_id, Some(151645));
    assert!(qinfo.end_of_generation_ids.contains(&151643));
    let enc = qtok.encode("x<|im_end|>", true).unwrap();
    assert_eq!(enc.get_ids().last(), Some(&151645));
    // special tokens are dropped when decoding with skip_special_tokens
    assert_eq!(qtok.decode(enc.get_ids(), true).unwrap(), "x");
}
