"""Run-time keys: the SQLite store, the registry's calls and long poll, and the ingress's admin
routes with its sync, all in one process (the registry is the class the actor runs, reached
through LocalRegistry; the router is a fake that answers as an engine would)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import pytest
from starlette.responses import Response

from core.config import ApiKeyConfig, ClusterConfig, KeyFields, hash_key, load_config
from core.errors import ApiError
from deployments.ingress.app import Ingress
from deployments.keys.ledger import KeyLedger, LocalLedger, MemorySnapshots
from deployments.keys.registry import KeyRegistry, KeySync, LocalRegistry, registry_actor_name
from deployments.keys.store import KeyNameTaken, KeyNotFound, KeyStore
from tests.fakes import serve_handle
from tests.fakes.http_request import keyed_request

TESTS = Path(__file__).parents[1]
ADMIN = "admin-secret"
PLAIN = "plain-secret"


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        self.now += 1
        return self.now


# -- The store -------------------------------------------------------------------------------


def test_the_store_keeps_digests_and_versions_across_a_reopen(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "keys.sqlite3"
    store = KeyStore(path, "app", Clock())
    assert (store.version(), store.active()) == (0, [])
    first = store.create("key_1", hash_key("secret-one"), KeyFields(name="ci", rpm=10))
    store.create("key_2", hash_key("s2"), KeyFields(name="bot"))
    store.update("key_1", KeyFields(name="ci", rpm=20))
    store.revoke("key_2")
    assert store.version() == 4
    store.close()

    again = KeyStore(path, "app", Clock())
    [kept] = again.active()
    assert (kept.id, kept.sha256, kept.fields.rpm) == ("key_1", hash_key("secret-one"), 20)
    assert kept.created_at == first.created_at < kept.updated_at
    assert again.version() == 4
    assert KeyStore(path, "other-app", Clock()).active() == []  # one file, apps apart
    assert b"secret-one" not in path.read_bytes()


def test_the_store_refuses_a_taken_name_and_an_unknown_or_revoked_id(tmp_path: Path) -> None:
    store = KeyStore(tmp_path / "keys.sqlite3", "app", Clock())
    store.create("key_1", hash_key("secret-one"), KeyFields(name="ci"))
    with pytest.raises(KeyNameTaken):
        store.create("key_2", hash_key("s2"), KeyFields(name="ci"))
    store.revoke("key_1")
    store.create("key_3", hash_key("s3"), KeyFields(name="ci"))  # a revoked key frees its name
    with pytest.raises(KeyNotFound):
        store.revoke("key_1")
    with pytest.raises(KeyNotFound):
        store.update("nope", KeyFields(name="x"))
    assert store.version() == 3
    # A second store over the same file (two registries, which a deploy never starts) still
    # sees the first's names: the check and the insert are one locked transaction.
    other = KeyStore(tmp_path / "keys.sqlite3", "app", Clock())
    with pytest.raises(KeyNameTaken):
        other.create("key_4", hash_key("s4"), KeyFields(name="ci"))
    assert other.version() == store.version() == 3


def test_the_registrys_name_follows_the_app_and_its_file() -> None:
    one = registry_actor_name("gateway", "/srv/keys.sqlite3")
    assert one == registry_actor_name("gateway", "/srv/keys.sqlite3")
    assert one.startswith("gps-key-registry-gateway-v")
    assert one != registry_actor_name("gateway", "/srv/other.sqlite3")
    assert one != registry_actor_name("other", "/srv/keys.sqlite3")


# -- The registry ----------------------------------------------------------------------------


def registry(tmp_path: Path) -> KeyRegistry:
    secrets = iter(f"secret-{n}" for n in range(100))
    return KeyRegistry("app", str(tmp_path / "keys.sqlite3"), Clock(), lambda: next(secrets))


def test_a_created_key_is_answered_once_with_its_secret_and_listed_without_it(
    tmp_path: Path,
) -> None:
    keys = registry(tmp_path)

    async def scenario() -> tuple[dict[str, Any], list[dict[str, Any]], tuple[int, Any]]:
        made = await keys.create({"name": "ci", "tpm": 500, "models": ["coding"]}, ["ops"])
        return made, await keys.listed(), await keys.watch(-1, 0)

    made, listed, (version, synced) = asyncio.run(scenario())
    assert made["key"] == "secret-0"
    assert made["id"].startswith("key_")
    assert (made["name"], made["tpm"], made["models"], made["source"]) == (
        "ci", 500, ["coding"], "api",
    )  # fmt: skip
    assert [k["id"] for k in listed] == [made["id"]]
    assert "key" not in listed[0]
    assert "sha256" not in listed[0]
    assert version == 1
    assert [ApiKeyConfig.model_validate(k).sha256 for k in synced] == [hash_key("secret-0")]
    assert not ApiKeyConfig.model_validate(synced[0]).admin


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"name": "ops"}, 409, "name"),  # a config key's name
        ({"name": "ci", "rpm": 0}, 400, "rpm"),
        ({"name": "ci", "admin": True}, 400, "admin"),  # admin keys are config keys only
        ({"name": "ci", "sha256": hash_key("mine")}, 400, "sha256"),  # the registry makes it
        ({"rpm": 5}, 400, "name"),
        ({"name": "ci", "priority": "user", "max_priority": "background"}, 400, None),
    ],
)
def test_a_bad_key_is_refused_with_the_field_named(
    tmp_path: Path, body: dict[str, Any], status: int, param: str | None
) -> None:
    keys = registry(tmp_path)
    with pytest.raises(ApiError) as refused:
        asyncio.run(keys.create(body, ["ops"]))
    assert (refused.value.status, refused.value.param) == (status, param)
    assert asyncio.run(keys.listed()) == []


def test_changes_and_revocations_answer_a_waiting_watch(tmp_path: Path) -> None:
    keys = registry(tmp_path)

    async def scenario() -> list[Any]:
        made = await keys.create({"name": "ci"}, [])
        version, _ = await keys.watch(-1, 0)
        idle = await keys.watch(version, 0.01)  # nothing changed: (seen, None)
        waiting = asyncio.create_task(keys.watch(version, 60))
        await asyncio.sleep(0)
        changed = await keys.update(made["id"], {"rpm": 7}, [])
        after_change = await waiting
        waiting = asyncio.create_task(keys.watch(after_change[0], 60))
        await asyncio.sleep(0)
        await keys.revoke(made["id"])
        after_revoke = await waiting
        with pytest.raises(ApiError) as gone:
            await keys.revoke(made["id"])
        return [idle, changed, after_change, after_revoke, gone.value.status]

    idle, changed, (v2, synced), (v3, emptied), gone = asyncio.run(scenario())
    assert idle == (1, None)
    assert changed["rpm"] == 7
    assert (v2, [k["rpm"] for k in synced]) == (2, [7])
    assert (v3, emptied) == (3, [])
    assert gone == 404


# -- Through the ingress ---------------------------------------------------------------------


@pytest.fixture
def config() -> ClusterConfig:
    base = load_config(TESTS / "e2e" / "gateway.yaml", environ={})
    keys = (
        ApiKeyConfig(name="ops", sha256=hash_key(ADMIN), admin=True),
        ApiKeyConfig(name="plain", sha256=hash_key(PLAIN)),
    )
    return base.model_copy(update={"api_keys": keys})


http = keyed_request


CHAT = {"model": "orchestrator", "messages": [{"role": "user", "content": "hi"}]}


async def status_of(call: Awaitable[Response]) -> int:
    try:
        response = await call
    except ApiError as error:
        return error.status
    return response.status_code


def chat_status(ingress: Ingress, key: str) -> Awaitable[int]:
    return status_of(ingress.chat(http(key, "POST", "/v1/chat/completions", CHAT)))


async def settled(sync: KeySync, version: int) -> None:
    """Until the replica's copy is at `version` (the long poll answers within the loop)."""
    for _ in range(2000):
        if sync.version >= version:
            return
        await asyncio.sleep(0.005)
    pytest.fail(f"the sync never reached version {version} (at {sync.version})")


def test_a_key_created_changed_and_revoked_at_run_time_through_the_ingress(
    config: ClusterConfig, tmp_path: Path
) -> None:
    keys = LocalRegistry(registry(tmp_path))
    ledger = LocalLedger(KeyLedger("unit", store=MemorySnapshots()))

    async def scenario() -> dict[str, Any]:
        router = serve_handle.EngineLikeRouter()
        ingress = Ingress(config, router, lambda: ledger, registry=lambda: keys)
        sync = ingress._key_sync
        assert sync is not None
        seen: dict[str, Any] = {}
        # Before the replica has read the run-time keys, an unknown key may be one: a 503.
        seen["pending"] = await chat_status(ingress, "unknown")
        await settled(sync, 0)
        by_plain = ingress.create_key(http(PLAIN, "POST", "/v1/keys", {"name": "x"}))
        seen["by_plain"] = await status_of(by_plain)
        made = await ingress.create_key(http(ADMIN, "POST", "/v1/keys", {"name": "ci", "rpm": 2}))
        secret = json.loads(bytes(made.body))
        await settled(sync, 1)
        seen["created"] = made.status_code
        # rpm 2: the third is a 429
        seen["uses"] = [await chat_status(ingress, secret["key"]) for _ in range(3)]
        patch = http(ADMIN, "PATCH", "/v1/keys/x", {"rpm": 100})
        patched = await ingress.update_key(patch, secret["id"])
        await settled(sync, 2)
        seen["patched"] = json.loads(bytes(patched.body))["rpm"]
        seen["after_patch"] = await chat_status(ingress, secret["key"])
        listed = json.loads(bytes((await ingress.list_keys(http(ADMIN, "GET", "/v1/keys"))).body))
        seen["listed"] = [(k["id"], k["source"]) for k in listed["data"]]
        seen["secrets_listed"] = [k for k in listed["data"] if "key" in k or "sha256" in k]
        config_patch = http(ADMIN, "PATCH", "/v1/keys/x", {"rpm": 1})
        seen["config_patch"] = await status_of(ingress.update_key(config_patch, "config:plain"))
        await ingress.revoke_key(http(ADMIN, "DELETE", "/v1/keys/x"), secret["id"])
        await settled(sync, 3)
        seen["revoked"] = await chat_status(ingress, secret["key"])
        seen["id"] = secret["id"]
        assert sync.task is not None
        sync.task.cancel()
        return seen

    seen = asyncio.run(scenario())
    assert seen["pending"] == 503
    assert seen["by_plain"] == 403
    assert seen["created"] == 201
    assert seen["uses"] == [200, 200, 429]
    assert (seen["patched"], seen["after_patch"]) == (100, 200)
    configured = [("config:ops", "config"), ("config:plain", "config")]
    assert seen["listed"] == [*configured, (seen["id"], "api")]
    assert seen["secrets_listed"] == []
    assert seen["config_patch"] == 400
    assert seen["revoked"] == 401


def test_the_keys_file_is_relative_to_the_config_file(config: ClusterConfig) -> None:
    assert config.keys_db == (TESTS / "e2e" / ".keys" / "keys.sqlite3").resolve()
    moved = config.gateway.model_copy(update={"keys_db": Path("/srv/gps/keys.sqlite3")})
    assert config.model_copy(update={"gateway": moved}).keys_db == Path("/srv/gps/keys.sqlite3")


def test_the_sync_keeps_the_last_keys_while_the_registry_is_gone_and_catches_up_after(
    tmp_path: Path,
) -> None:
    """A registry lost (its actor killed, the GCS restarted) fails the long poll: the replica
    keeps the keys it holds, asks again, and a new registry over the same file answers it."""
    path = str(tmp_path / "keys.sqlite3")
    first = KeyRegistry("app", path)
    registries: list[KeyRegistry | None] = [first]
    applied: list[list[str]] = []
    failures = 0

    class Flaky(LocalRegistry):
        async def watch(self, seen: int, timeout_s: float) -> tuple[int, Any]:
            nonlocal failures
            if registries[-1] is None:
                failures += 1
                raise ConnectionError("the registry actor is gone")
            return await super().watch(seen, timeout_s)

    def connect() -> Flaky:
        current = registries[-1]
        if current is None:
            raise ConnectionError("no registry to connect to")
        return Flaky(current)

    sync = KeySync(connect, lambda keys: applied.append([k.name for k in keys]), 60, 0.001)

    async def scenario() -> None:
        task = asyncio.create_task(sync.run())
        await first.create({"name": "first"}, [])
        await settled(sync, 1)
        registries.append(None)
        first._changed()  # the waiting poll returns, and the next one fails
        for _ in range(2000):
            if failures:
                break
            await asyncio.sleep(0.005)
        second = KeyRegistry("app", path)  # reads the keys back from the file
        registries.append(second)
        await second.create({"name": "second"}, [])
        await settled(sync, 2)
        task.cancel()

    asyncio.run(scenario())
    assert applied == [["first"], ["first", "second"]]
    assert failures >= 1


def test_a_failure_to_apply_the_keys_is_retried_not_the_end_of_the_sync(tmp_path: Path) -> None:
    keys = registry(tmp_path)
    applied: list[list[str]] = []
    refusals = [RuntimeError("the ring refused them")]

    def apply(run_time: list[ApiKeyConfig]) -> None:
        if refusals:
            raise refusals.pop()
        applied.append([k.name for k in run_time])

    sync = KeySync(lambda: LocalRegistry(keys), apply, 60, 0.001)

    async def scenario() -> None:
        await keys.create({"name": "ci"}, [])
        task = asyncio.create_task(sync.run())
        await settled(sync, 1)
        task.cancel()

    asyncio.run(scenario())
    assert applied == [["ci"]]
    assert sync.synced
