"""`/v1/embeddings` through the gateway: the demo model on vLLM's pooling runner, asked with the
official `openai` SDK (which asks for base64 and decodes it) and plain HTTP (floats): one input
and a batch, `dimensions`, token counts in `usage`, inputs over the window refused or truncated as
the request says, and every client mistake a 400 that leaves the backend healthy."""

from __future__ import annotations

import base64
import math
import struct

import httpx
import openai
import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from core.config import ClusterConfig
from core.types import Role

MODEL = "smollm2-embed"
WIDTH = 576  # SmolLM2-135M's hidden size: the vector's length
TEXTS = ["The cat sat on the mat.", "GPUs run out of memory.", "def add(a, b): return a + b"]


@pytest.fixture(scope="module")
def tokenizer(config: ClusterConfig) -> PreTrainedTokenizerBase:
    source = config.resolve_path(config.model_for(Role.EMBEDDING).source)
    loaded: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(source)
    return loaded


@pytest.fixture(scope="module")
def window(config: ClusterConfig) -> int:
    return config.model_for(Role.EMBEDDING).context_window


def _norm(vector: list[float]) -> float:
    return math.sqrt(sum(x * x for x in vector))


def test_one_input_is_one_unit_vector_with_its_token_count(
    client: openai.OpenAI, tokenizer: PreTrainedTokenizerBase
) -> None:
    raw = client.embeddings.with_raw_response.create(model=MODEL, input=TEXTS[0])
    answer = raw.parse()
    [item] = answer.data
    assert item.index == 0
    assert len(item.embedding) == WIDTH
    assert _norm(item.embedding) == pytest.approx(1.0, abs=1e-2)  # vLLM normalizes
    assert answer.usage.prompt_tokens == len(tokenizer.encode(TEXTS[0]))
    assert answer.usage.total_tokens == answer.usage.prompt_tokens
    assert raw.headers["x-backend"] == "embedding@local"
    assert float(raw.headers["x-gateway-overhead-ms"]) >= 0


def test_a_batch_keeps_its_order_and_the_same_text_gives_the_same_vector(
    client: openai.OpenAI, tokenizer: PreTrainedTokenizerBase
) -> None:
    answer = client.embeddings.create(model=MODEL, input=[*TEXTS, TEXTS[0]])
    assert [item.index for item in answer.data] == [0, 1, 2, 3]
    vectors = [item.embedding for item in answer.data]
    assert vectors[3] == pytest.approx(vectors[0], abs=1e-2)
    assert vectors[1] != pytest.approx(vectors[0], abs=1e-2)
    assert answer.usage.prompt_tokens == sum(
        len(tokenizer.encode(text)) for text in [*TEXTS, TEXTS[0]]
    )


def test_dimensions_shorten_the_vector_and_it_stays_a_unit_vector(client: openai.OpenAI) -> None:
    answer = client.embeddings.create(model=MODEL, input=TEXTS, dimensions=64)
    for item in answer.data:
        assert len(item.embedding) == 64
        assert _norm(item.embedding) == pytest.approx(1.0, abs=1e-2)


def test_floats_and_base64_carry_the_same_vector(http: httpx.Client) -> None:
    def ask(encoding: str) -> list[float] | str:
        answer = http.post(
            "/v1/embeddings",
            json={"model": MODEL, "input": TEXTS[1], "encoding_format": encoding},
        )
        assert answer.status_code == 200, answer.text
        vector: list[float] | str = answer.json()["data"][0]["embedding"]
        return vector

    floats = ask("float")
    packed = ask("base64")
    assert isinstance(floats, list)
    assert isinstance(packed, str)
    raw = base64.b64decode(packed)
    decoded = list(struct.unpack(f"<{len(raw) // 4}f", raw))
    assert decoded == pytest.approx(floats, abs=1e-3)


def test_token_ids_are_embedded_as_given(
    client: openai.OpenAI, tokenizer: PreTrainedTokenizerBase
) -> None:
    ids = tokenizer.encode(TEXTS[0])
    by_ids = client.embeddings.create(model=MODEL, input=[ids]).data[0].embedding
    by_text = client.embeddings.create(model=MODEL, input=TEXTS[0]).data[0].embedding
    assert by_ids == pytest.approx(by_text, abs=1e-2)


def test_an_input_over_the_window_is_refused_naming_it_unless_truncation_is_asked(
    http: httpx.Client, window: int
) -> None:
    long_text = "word " * (window + 200)
    refused = http.post("/v1/embeddings", json={"model": MODEL, "input": ["short", long_text]})
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert "input[1]" in error["message"]
    assert "truncate_prompt_tokens" in error["message"]
    for truncate, tokens in ((-1, window), (10, 10), (window * 4, window)):
        answer = http.post(
            "/v1/embeddings",
            json={"model": MODEL, "input": long_text, "truncate_prompt_tokens": truncate},
        )
        assert answer.status_code == 200, answer.text
        assert answer.json()["usage"]["prompt_tokens"] == tokens
        assert answer.headers["x-context-fitted"] == "true"


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"model": "smollm2", "input": "hi"}, "generates text, not embeddings"),
        ({"model": "auto", "input": "hi"}, "generates text, not embeddings"),
        ({"model": MODEL, "input": "hi", "dimensions": WIDTH + 1}, "dimensions"),
        ({"model": MODEL, "input": [[10**6]]}, "vocabulary"),
        ({"model": MODEL, "input": []}, "input"),
        ({"model": MODEL, "input": "hi", "encoding_format": "int8"}, "encoding_format"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}, "messages"),
        ({"model": MODEL, "input": "hi", "stream": True}, "not a field of an embeddings"),
        ({"model": MODEL, "input": "hi", "max_tokens": 10**9}, "max_tokens"),
        ({"model": MODEL, "input": "hi", "tools": []}, "tools"),
    ],
)
def test_a_client_mistake_is_a_400_and_the_backend_stays_healthy(
    http: httpx.Client, body: dict[str, object], words: str
) -> None:
    refused = http.post("/v1/embeddings", json=body)
    assert refused.status_code == 400, refused.text
    assert words in refused.json()["error"]["message"]
    answer = http.post("/v1/embeddings", json={"model": MODEL, "input": "still here"})
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-backend"] == "embedding@local"


def test_text_endpoints_never_reach_the_embedding_model(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="/v1/embeddings"):
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
    with pytest.raises(openai.BadRequestError, match="/v1/embeddings"):
        client.completions.create(model=MODEL, prompt="hi", max_tokens=4)


def test_the_model_list_names_the_embedding_model(client: openai.OpenAI) -> None:
    assert {"embedding", MODEL} <= {model.id for model in client.models.list()}
