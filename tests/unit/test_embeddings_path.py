"""`/v1/embeddings` before any engine: the body's shapes, inputs counted against the window,
and chains that give vectors from embedding backends only."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from core.config import ConfigError, load_config
from core.errors import ApiError
from core.types import Role
from policy.context.embed_fit import MAX_REQUEST_TOKENS, InputTooLong, TooManyTokens, fit_inputs
from policy.context.tokens import CharEstimateCounter
from policy.request import check_embedding_request, embedding_inputs

BASE: dict[str, Any] = {
    "pools": [{"name": "local", "kind": "local"}],
    "models": [
        {"role": "orchestrator", "source": "./m", "context_window": 4096, "pools": ["local"]},
        {"role": "embedding", "source": "./e", "context_window": 512, "pools": ["local"]},
    ],
    "fallback": {"source": "./fallback.gguf"},
}


@pytest.mark.parametrize(
    ("raw", "count"),
    [("one text", 1), (["a", "b", "c"], 3), ([1, 2, 3], 1), ([[1, 2], [3]], 2)],
)
def test_openais_four_input_shapes_are_one_input_each(raw: Any, count: int) -> None:
    check_embedding_request({"input": raw, "dimensions": 8, "encoding_format": "base64"})
    assert len(embedding_inputs(raw)) == count


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({}, "input"),
        ({"input": ""}, "input"),
        ({"input": []}, "input"),
        ({"input": ["a", ""]}, "input[1]"),
        ({"input": [[1], []]}, "input[1]"),
        ({"input": ["a", 1]}, "input[1]"),
        ({"input": {"text": "a"}}, "input"),
        ({"input": ["a"] * 2049}, "input"),
        ({"input": "a", "dimensions": 0}, "dimensions"),
        ({"input": "a", "encoding_format": "int8"}, "encoding_format"),
        ({"input": "a", "truncate_prompt_tokens": -2}, "truncate_prompt_tokens"),
        ({"input": "a", "truncate_prompt_tokens": 0}, "truncate_prompt_tokens"),
        ({"input": "a", "stream": True}, "stream"),
        ({"input": "a", "max_tokens": 10**9}, "max_tokens"),
        ({"input": "a", "tools": []}, "tools"),
        ({"input": "a", "messages": []}, "messages"),
        ({"input": "a", "prompt": "b"}, "prompt"),
    ],
)
def test_each_mistake_is_a_400_naming_its_field(body: dict[str, Any], param: str) -> None:
    with pytest.raises(ApiError) as refused:
        check_embedding_request(body)
    assert refused.value.status == 400
    assert refused.value.param == param


class ExactChars(CharEstimateCounter):
    """Four characters a token, taken as exact (as a tokenizer's count is)."""

    exact = True


def test_an_input_over_the_window_is_refused_by_name_unless_truncation_is_asked() -> None:
    counter = ExactChars()
    inputs: list[str | list[int]] = ["short", "x" * 4000, list(range(100))]
    with pytest.raises(InputTooLong) as refused:
        fit_inputs(inputs, window=512, truncate_prompt_tokens=None, counter=counter)
    assert refused.value.index == 1
    assert "input[1]" in str(refused.value)
    fit = fit_inputs(inputs, window=512, truncate_prompt_tokens=-1, counter=counter)
    assert fit.truncated == 1
    assert fit.fitted
    assert fit.prompt_tokens == counter.count_raw("short") + 512 + 100
    assert fit.largest == 512  # what must fit the KV cache: one input, not the batch


def test_an_estimate_over_the_window_is_left_for_the_engine_to_judge() -> None:
    fit = fit_inputs(
        ["x" * 4000], window=512, truncate_prompt_tokens=None, counter=CharEstimateCounter()
    )
    assert (fit.truncated, fit.counted) == (0, False)
    with pytest.raises(InputTooLong):  # token ids are counted exactly, estimate or not
        fit_inputs(
            [list(range(600))],
            window=512,
            truncate_prompt_tokens=None,
            counter=CharEstimateCounter(),
        )


def test_a_request_past_openais_token_limit_is_refused_whole() -> None:
    inputs: list[str | list[int]] = [list(range(500))] * (MAX_REQUEST_TOKENS // 500 + 1)
    with pytest.raises(TooManyTokens, match="smaller batches"):
        fit_inputs(inputs, window=512, truncate_prompt_tokens=None, counter=ExactChars())


def test_an_embedding_chain_holds_embedding_backends_only(tmp_path: Path) -> None:
    path = _write(tmp_path, {"embedding": ["embedding@local", "orchestrator@local"]})
    with pytest.raises(ConfigError, match=r"'orchestrator@local' serves text"):
        load_config(path, environ={})


def test_a_truncation_beyond_the_window_is_sent_as_the_window() -> None:
    counter = ExactChars()
    inputs: list[str | list[int]] = [list(range(600)), "short"]
    fit = fit_inputs(inputs, window=512, truncate_prompt_tokens=4096, counter=counter)
    assert (fit.truncate_to, fit.truncated) == (512, 1)
    assert fit.prompt_tokens == 512 + counter.count_raw("short")
    kept = fit_inputs(inputs, window=512, truncate_prompt_tokens=-1, counter=counter)
    assert kept.truncate_to == -1  # the engine's own window: right on whichever link it lands
    untouched = fit_inputs(["short"], window=512, truncate_prompt_tokens=None, counter=counter)
    assert (untouched.truncate_to, untouched.truncated) == (None, 0)


def _write(tmp_path: Path, chains: dict[str, list[str]]) -> Path:
    data = copy.deepcopy(BASE)
    data["chains"] = chains
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_an_embedding_chain_never_lists_the_text_fallback(tmp_path: Path) -> None:
    path = _write(tmp_path, {"embedding": ["embedding@local", "cpu-fallback"]})
    with pytest.raises(ConfigError, match=r"'cpu-fallback' serves text, not vectors"):
        load_config(path, environ={})


def test_the_default_embedding_chain_is_its_pools_without_the_fallback(tmp_path: Path) -> None:
    config = load_config(_write(tmp_path, {}), environ={})
    assert config.chain(Role.EMBEDDING) == ("embedding@local",)
    assert config.chain(Role.ORCHESTRATOR)[-1] == "cpu-fallback"


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"engine_kwargs": {"runner": "generate"}}, "engine_kwargs.runner: the role decides"),
        ({"tools": {"parser": "hermes"}}, "an embedding model calls no tools"),
    ],
)
def test_an_embedding_model_keeps_its_runner_and_takes_no_tools(
    tmp_path: Path, change: dict[str, Any], words: str
) -> None:
    data = copy.deepcopy(BASE)
    data["models"][1].update(change)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match=words):
        load_config(path, environ={})
