"""The official `openai` Python client against a running Airlock daemon.

Usage: python3 openai_client.py BASE_URL TOKEN
Lists models, creates embeddings (the client's default base64 encoding and explicit floats),
streams a chat completion and reads the `airlock` extension of the first chunk, then a
non-streaming completion. Exits non-zero on any mismatch.
"""
import math
import sys

import openai


def main() -> None:
    base, token = sys.argv[1], sys.argv[2]
    client = openai.OpenAI(base_url=base + "/v1", api_key=token, max_retries=0, timeout=900)

    ids = [m.id for m in client.models.list().data]
    assert "airlock-small" in ids and "airlock-embed" in ids, ids

    # Default encoding_format is base64 in current clients; the client decodes it.
    emb = client.embeddings.create(model="airlock-embed", input=["A man is eating food.",
                                                                  "A man is eating a piece of bread."])
    a, b = emb.data[0].embedding, emb.data[1].embedding
    assert len(a) == 384 and len(b) == 384, (len(a), len(b))
    cos = sum(x * y for x, y in zip(a, b))
    assert abs(cos - 0.7553) < 0.01, cos
    floats = client.embeddings.create(model="airlock-embed", input="A man is eating food.",
                                      encoding_format="float")
    assert all(math.isclose(x, y, abs_tol=1e-6) for x, y in zip(floats.data[0].embedding, a))

    stream = client.chat.completions.create(
        model="airlock-small",
        messages=[{"role": "user", "content": "What is the minimum liquidity buffer?"}],
        stream=True,
        max_tokens=16,
    )
    first, text, chunks = None, "", 0
    for chunk in stream:
        chunks += 1
        if first is None:
            first = chunk
        if chunk.choices and chunk.choices[0].delta.content:
            text += chunk.choices[0].delta.content
    assert first is not None and text, (chunks, text)
    airlock = (first.model_extra or {}).get("airlock") or {}
    assert airlock.get("rung") == 0, airlock
    cites = airlock.get("citations") or []
    assert cites and cites[0]["doc_id"] == "doc-risk", cites

    resp = client.chat.completions.create(
        model="airlock-small",
        messages=[{"role": "user", "content": "What is the minimum liquidity buffer?"}],
        max_tokens=8,
    )
    assert resp.choices[0].message.content, resp
    assert resp.usage.completion_tokens >= 1

    # Errors surface as the client's typed exceptions, with the daemon's message (the
    # problem's OpenAI-style `error` member).
    try:
        client.chat.completions.create(model="gpt-4", messages=[{"role": "user", "content": "hi"}])
        raise AssertionError("unknown model accepted")
    except openai.NotFoundError as e:
        assert "no model `gpt-4`" in str(e), str(e)

    # Fields the daemon does not implement are refused by name, not silently ignored.
    refused = {
        "tools": {"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]},
        "n": {"n": 2},
        "response_format": {"response_format": {"type": "json_object"}},
        "logprobs": {"logprobs": True},
    }
    for field, extra in refused.items():
        try:
            client.chat.completions.create(
                model="airlock-small", messages=[{"role": "user", "content": "hi"}],
                max_tokens=2, **extra)
            raise AssertionError(f"{field} accepted")
        except openai.BadRequestError as e:
            assert e.code == "unsupported_parameter", (field, e.code, e.body)
            assert e.param == field, (field, e.param)
            assert field in e.message, e.message

    # stream_options.include_usage: the last chunk has no choices and the usage.
    stream = client.chat.completions.create(
        model="airlock-small",
        messages=[{"role": "user", "content": "What is the minimum liquidity buffer?"}],
        stream=True, max_tokens=4, stream_options={"include_usage": True})
    last = None
    for chunk in stream:
        last = chunk
    assert last is not None and last.choices == [] and last.usage.total_tokens > 0, last
    print(f"openai client ok: {chunks} chunks, {len(text)} chars streamed")


if __name__ == "__main__":
    main()
