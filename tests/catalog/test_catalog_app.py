"""An open catalog on real vLLM CPU engines (catalog.yaml): two models of role coding, a LoRA
adapter on the default one, made here from the demo model (real files vLLM must load), and a
key limited to one model, all through the official openai SDK.

A session of its own (`make test` runs it in the lane beside the main session): two engines and
a cluster of its own. The kill comes last: it leaves the default model's replica to Serve.
"""

from __future__ import annotations

import gc
import warnings
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
import ray
from openai.types.chat import ChatCompletionMessageParam
from ray import serve

from bench.lora_adapter import make_adapter
from cluster.app import build_app
from core.config import load_config

ROOT = Path(__file__).parents[2]
CONFIG = Path(__file__).with_name("catalog.yaml")
ADAPTER = ROOT / ".models" / "test-adapters" / "coder-big-sql"  # catalog.yaml's source
PORT = 18900
APP = "catalog"
ALL_KEY, SMALL_KEY = "catalog-all", "catalog-small-only"  # catalog.yaml's keys
QUESTION: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "Write one SQL query that counts the rows of a table."}
]


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    make_adapter(ROOT / ".models" / "SmolLM2-135M-Instruct", ADAPTER, rank=8, seed=7)
    config = load_config(CONFIG, environ={})
    ray.init(address="local", num_cpus=2, resources={"pool_local": 1}, namespace="serve")
    serve.start(http_options={"host": "127.0.0.1", "port": PORT})
    serve.run(build_app(config), name=APP, route_prefix="/")
    yield f"http://127.0.0.1:{PORT}"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)  # Ray's own node processes' Popen
        serve.shutdown()
        ray.shutdown()
        gc.collect()


def client(url: str, key: str = ALL_KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=300)


def ask(url: str, model: str, key: str = ALL_KEY) -> tuple[str, str]:
    """A greedy answer of `model` and the backend that gave it."""
    raw = client(url, key).chat.completions.with_raw_response.create(
        model=model, messages=QUESTION, max_tokens=24, temperature=0
    )
    return raw.parse().choices[0].message.content or "", raw.headers["x-backend"]


def test_every_name_answers_on_its_model(url: str) -> None:
    served = {name: ask(url, name)[1] for name in ("coder-big", "coder-small", "coding")}
    assert served == {
        "coder-big": "coder-big@local",
        "coder-small": "coder-small@local",
        "coding": "coder-big@local",  # the role's default
    }


def test_the_adapter_answers_on_its_base_models_replica_and_changes_the_answer(url: str) -> None:
    base, base_backend = ask(url, "coder-big")
    again, _ = ask(url, "coder-big")
    adapted, adapter_backend = ask(url, "coder-big-sql")
    assert (base_backend, adapter_backend) == ("coder-big@local", "coder-big@local")
    assert base == again  # greedy: the base model repeats itself
    assert adapted
    assert adapted != base, base
    cards = {m.id: m for m in client(url).models.list()}
    adapter_card = cards["coder-big-sql"].model_extra or {}
    # `root` as the config gives it (as for a model's weights), `parent` the base model.
    assert (adapter_card["parent"], adapter_card["root"]) == (
        "coder-big",
        "../../.models/test-adapters/coder-big-sql",
    )


def test_a_key_limited_to_one_model_sees_and_uses_only_it(url: str) -> None:
    small = client(url, SMALL_KEY)
    assert [m.id for m in small.models.list()] == ["coder-small"]
    assert ask(url, "coder-small", SMALL_KEY)[1] == "coder-small@local"
    for name in ("coder-big", "coder-big-sql", "coding", "gpt-17"):
        with pytest.raises(openai.PermissionDeniedError) as refused:
            small.chat.completions.create(model=name, messages=QUESTION, max_tokens=2)
        assert refused.value.code == "model_not_allowed", name


def test_the_default_models_death_fails_over_to_the_other_model_of_its_role(url: str) -> None:
    prefix = f"SERVE_REPLICA::{APP}#model:coder-big@local#"
    [victim] = [
        actor["name"]
        for actor in ray.util.list_named_actors(all_namespaces=True)
        if actor["namespace"] == "serve" and actor["name"].startswith(prefix)
    ]
    ray.kill(ray.get_actor(victim, namespace="serve"), no_restart=True)
    backends = [ask(url, "coding")[1] for _ in range(4)]
    # The other coding model, never the CPU fallback, while coder-big is being replaced.
    assert backends == ["coder-small@local"] * 4, backends
