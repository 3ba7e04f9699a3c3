"""The official `openai` Python client against Airlock, naming a remote (rack) generator.

Usage: python3 openai_rack_client.py BASE_URL TOKEN ALIAS
Lists models (the alias is a generator), streams a chat completion and reads the `airlock`
extension of the first chunk, then a non-streaming completion. Exits non-zero on a mismatch.
"""
import sys

import openai


def main() -> None:
    base, token, alias = sys.argv[1], sys.argv[2], sys.argv[3]
    client = openai.OpenAI(base_url=base + "/v1", api_key=token, max_retries=0, timeout=900)
    ids = [m.id for m in client.models.list().data]
    assert alias in ids and "airlock-small" in ids, ids

    question = [{"role": "user", "content": "What is the minimum liquidity buffer?"}]
    stream = client.chat.completions.create(model=alias, messages=question, stream=True,
                                            max_tokens=16)
    first, text, chunks = None, "", 0
    for chunk in stream:
        chunks += 1
        if first is None:
            first = chunk
        assert chunk.model == alias, chunk.model
        if chunk.choices and chunk.choices[0].delta.content:
            text += chunk.choices[0].delta.content
    assert first is not None and text, (chunks, text)
    airlock = (first.model_extra or {}).get("airlock") or {}
    cites = airlock.get("citations") or []
    assert cites and cites[0]["doc_id"] == "doc-risk", cites

    resp = client.chat.completions.create(model=alias, messages=question, max_tokens=8)
    assert resp.model == alias, resp.model
    assert resp.choices[0].message.content, resp
    assert resp.usage.completion_tokens >= 1, resp.usage
    extra = (resp.model_extra or {}).get("airlock") or {}
    assert extra.get("citations"), extra

    # stream_options.include_usage: the last chunk has no choices and the usage.
    stream = client.chat.completions.create(model=alias, messages=question, stream=True,
                                            max_tokens=4, stream_options={"include_usage": True})
    last = None
    for chunk in stream:
        last = chunk
    assert last is not None and last.choices == [] and last.usage.total_tokens > 0, last
    print(f"openai client ok against {alias}: {chunks} chunks, {len(text)} chars streamed")


if __name__ == "__main__":
    main()
