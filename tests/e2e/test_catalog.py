"""An open catalog in the shared app (gateway.yaml): two models of role reasoning by name (on the
test engine: the router is the subject), a LoRA adapter of vision made by this session from the
demo model (real files the vLLM engine must load), and a key limited to one model of a role that
has two, all through the official openai SDK.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam
from ray.serve.handle import DeploymentHandle

from bench.multinode import wait_for

THINKER, THINKER_SMALL = "thinker@local", "thinker-small@local"
SMALL_KEY = "test-thinker-small-only"  # gateway.yaml's key limited to thinker-small
QUESTION: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "Write one SQL query that counts the rows of a table."}
]


def ask(client: openai.OpenAI, model: str) -> tuple[str, str]:
    """A greedy answer of `model` and the backend that gave it."""
    raw = client.chat.completions.with_raw_response.create(
        model=model, messages=QUESTION, max_tokens=24, temperature=0
    )
    return raw.parse().choices[0].message.content or "", raw.headers["x-backend"]


def test_every_name_answers_on_its_model(client: openai.OpenAI) -> None:
    served = {name: ask(client, name)[1] for name in ("thinker", "thinker-small", "reasoning")}
    assert served == {
        "thinker": THINKER,
        "thinker-small": THINKER_SMALL,
        "reasoning": THINKER,  # the role's default
    }


def test_the_adapter_answers_on_its_base_models_replica_and_changes_the_answer(
    client: openai.OpenAI,
) -> None:
    base, base_backend = ask(client, "vision")
    again, _ = ask(client, "vision")
    adapted, adapter_backend = ask(client, "vision-sql")
    assert (base_backend, adapter_backend) == ("vision@local", "vision@local")
    assert base == again  # greedy: the base model repeats itself
    assert adapted
    assert adapted != base, base
    cards = {m.id: m for m in client.models.list()}
    adapter_card = cards["vision-sql"].model_extra or {}
    # `root` as the config gives it (as for a model's weights), `parent` the base model.
    assert (adapter_card["parent"], adapter_card["root"]) == (
        "vision",
        "adapters/vision-sql",
    )


def test_a_key_limited_to_one_model_of_a_role_sees_and_uses_only_it(gateway: str) -> None:
    small = openai.OpenAI(base_url=f"{gateway}/v1", api_key=SMALL_KEY, max_retries=0, timeout=120)
    assert [m.id for m in small.models.list()] == ["thinker-small"]
    assert ask(small, "thinker-small")[1] == THINKER_SMALL
    # The role's name reaches thinker, which the key may not use.
    for name in ("thinker", "reasoning", "vision-sql", "gpt-17"):
        with pytest.raises(openai.PermissionDeniedError) as refused:
            small.chat.completions.create(model=name, messages=QUESTION, max_tokens=2)
        assert refused.value.code == "model_not_allowed", name


@pytest.fixture
def failing_thinker(thinker_probe: DeploymentHandle, http: httpx.Client) -> Iterator[None]:
    thinker_probe.set_faulty.remote(True).result()
    yield
    thinker_probe.set_faulty.remote(False).result()

    def closed() -> bool:
        backend = http.get("/v1/cluster/status").json()["backends"][THINKER]
        return bool(backend["breaker"] == "closed")

    wait_for(closed, 120, "thinker@local's breaker to close once it answers again")


@pytest.mark.usefixtures("failing_thinker")
def test_the_default_models_fault_fails_over_to_the_other_model_of_its_role(
    client: openai.OpenAI,
) -> None:
    backends = [ask(client, "reasoning")[1] for _ in range(4)]
    # The other reasoning model (no chain is configured for the role), never the CPU fallback.
    assert backends == [THINKER_SMALL] * 4, backends
