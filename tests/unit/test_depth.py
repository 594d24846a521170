"""The depth router: explicit hints first, then phrases, then the message's shape."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.config import ClusterConfig, ConfigError, DepthConfig, parse_config
from core.types import Depth
from policy.depth import UnknownDepth, classify

RULES = DepthConfig()


def depth_of(text: str, **kwargs: str) -> Depth:
    return classify(text, rules=RULES, **kwargs).depth


def test_header_wins_over_everything() -> None:
    decision = classify("Explain everything step by step", rules=RULES, header=" Quick ")
    assert (decision.depth, decision.reason) == (Depth.QUICK, "header")


def test_unknown_header_is_an_error_that_lists_the_depths() -> None:
    with pytest.raises(UnknownDepth, match="quick, balanced, deep, exhaustive"):
        classify("hi", rules=RULES, header="deepest")


@pytest.mark.parametrize(
    ("effort", "depth"),
    [
        ("low", Depth.QUICK),
        ("medium", Depth.BALANCED),
        ("high", Depth.DEEP),
        ("max", Depth.EXHAUSTIVE),
    ],
)
def test_reasoning_effort_maps_to_a_depth(effort: str, depth: Depth) -> None:
    decision = classify("hi", rules=RULES, reasoning_effort=effort)
    assert (decision.depth, decision.reason) == (depth, "reasoning_effort")


@pytest.mark.parametrize(
    ("text", "depth"),
    [
        ("Briefly, what does this error mean? " + "word " * 100, Depth.QUICK),
        ("Walk me through the proof step by step.", Depth.DEEP),
        ("Give an exhaustive list of the failure modes, briefly.", Depth.EXHAUSTIVE),
    ],
)
def test_phrases_are_hints_and_the_strongest_wins(text: str, depth: Depth) -> None:
    decision = classify(text, rules=RULES)
    assert (decision.depth, decision.reason) == (depth, "hint")


def test_a_short_single_question_is_quick() -> None:
    assert classify("What is the capital of France?", rules=RULES).reason == "short"
    assert depth_of("What is the capital of France?") == Depth.QUICK


def test_length_moves_up_the_scale() -> None:
    medium = "word " * 100
    assert depth_of(medium) == Depth.BALANCED
    assert depth_of("word " * RULES.deep_min_words) == Depth.DEEP
    assert depth_of("word " * RULES.exhaustive_min_words) == Depth.EXHAUSTIVE


def test_several_questions_or_asks_are_deep() -> None:
    assert depth_of("Why? How? When?") == Depth.DEEP
    assert depth_of("Please:\n1. parse it\n2. sort it\n3. print it") == Depth.DEEP


def test_short_code_is_balanced_not_quick() -> None:
    decision = classify("Fix this:\n```\nprint(1\n```", rules=RULES)
    assert (decision.depth, decision.reason) == (Depth.BALANCED, "code")


def test_thresholds_come_from_config() -> None:
    strict = DepthConfig(quick_max_words=2, deep_min_words=5, exhaustive_min_words=9)
    assert classify("one two three four five", rules=strict).depth == Depth.DEEP


def test_thresholds_must_be_ordered() -> None:
    with pytest.raises(ValueError, match="quick_max_words < deep_min_words"):
        DepthConfig(quick_max_words=300, deep_min_words=250)


POOLS = [{"name": "local", "kind": "local"}]
FALLBACK = {"source": "model.gguf"}


def config_with(roles: list[str], depth: dict[str, object] | None = None) -> ClusterConfig:
    raw: dict[str, object] = {
        "pools": POOLS,
        "models": [
            {"role": r, "source": "m", "context_window": 4096, "pools": ["local"]} for r in roles
        ],
        "fallback": FALLBACK,
    }
    if depth is not None:
        raw["depth"] = depth
    return parse_config(raw, base_dir=Path("."), environ={})


def test_default_routes_send_deep_work_to_reasoning_with_the_whole_window() -> None:
    config = config_with(["orchestrator", "reasoning"])
    assert config.depth_route(Depth.QUICK) == ("orchestrator", 0.25)
    assert config.depth_route(Depth.DEEP) == ("reasoning", 1.0)


def test_a_route_to_an_unserved_role_falls_back_to_the_orchestrator() -> None:
    config = config_with(["orchestrator", "coding"])
    assert config.depth_route(Depth.DEEP)[0] == "orchestrator"


def test_routes_merge_with_the_defaults() -> None:
    config = config_with(
        ["orchestrator", "coding"], {"routes": {"deep": {"role": "coding", "context_share": 0.5}}}
    )
    assert config.depth_route(Depth.DEEP) == ("coding", 0.5)
    assert config.depth_route(Depth.QUICK)[1] == 0.25


def test_a_bad_share_names_the_field() -> None:
    with pytest.raises(ConfigError, match=r"depth\.routes.*context_share"):
        config_with(
            ["orchestrator"], {"routes": {"quick": {"role": "orchestrator", "context_share": 0}}}
        )
