"""Run-time keys on a running app of two ingress replicas (pressure.yaml), through its HTTP
port as a client sees it: an admin creates a key, clients use it in a closed loop beside the
config's load key, the admin revokes it, and every request sent a second after the revocation
answered is refused with a 401, whichever replica takes it (Serve's proxy spreads them over
both). Then the registry actor is lost, as a GCS restart loses it: the replicas keep serving
the keys they hold, a new registry reads them back from the SQLite file, and changes made
through it reach the replicas again. No log file of the cluster holds a secret it made."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import ray

from bench.multinode import wait_for
from core.config import ClusterConfig
from deployments.keys.registry import registry_actor_name
from tests.monitoring.pressure_app import ADMIN_HEADERS, APP, LOAD_HEADERS, PORT

URL = f"http://127.0.0.1:{PORT}"
CHAT = {"model": "coding", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
REFUSED_WITHIN_S = 1.0  # the bound for a revocation to reach every replica


class ClosedLoop:
    """`clients` threads, each sending its next chat once its last is answered, with the key
    `headers` names; every request's send time and status kept."""

    def __init__(self, headers: dict[str, str], clients: int) -> None:
        self.answers: list[tuple[float, int]] = []
        self._headers = headers
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(clients)]

    def _run(self) -> None:
        with httpx.Client(base_url=URL, headers=self._headers, timeout=120) as client:
            while not self._stop.is_set():
                sent = time.monotonic()
                try:
                    status = client.post("/v1/chat/completions", json=CHAT).status_code
                except httpx.HTTPError:
                    status = 0
                self.answers.append((sent, status))

    def statuses(self, sent_after: float = 0.0, sent_before: float = float("inf")) -> list[int]:
        return [s for at, s in list(self.answers) if sent_after <= at < sent_before]

    @contextmanager
    def running(self) -> Iterator[ClosedLoop]:
        for thread in self._threads:
            thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            for thread in self._threads:
                thread.join()


def admin(method: str, path: str, body: dict[str, Any] | None = None) -> httpx.Response:
    return httpx.request(method, f"{URL}{path}", json=body, headers=ADMIN_HEADERS, timeout=60)


def create(name: str) -> dict[str, Any]:
    made = admin("POST", "/v1/keys", {"name": name})
    assert made.status_code == 201, made.text
    key: dict[str, Any] = made.json()
    return key


def bearer(key: dict[str, Any]) -> dict[str, str]:
    return {"Authorization": f"Bearer {key['key']}"}


def served(key: dict[str, Any]) -> None:
    """Until ten requests in a row with `key` are answered (both replicas have it)."""
    wait_for(lambda: set(chats(bearer(key), 10)) == {200}, 30, f"{key['name']} to be served")


def chats(headers: dict[str, str], count: int) -> list[int]:
    with httpx.Client(base_url=URL, headers=headers, timeout=120) as client:
        return [client.post("/v1/chat/completions", json=CHAT).status_code for _ in range(count)]


def test_a_key_revoked_under_load_is_refused_on_every_replica_within_a_second(
    app: ClusterConfig,
) -> None:
    assert app.gateway.ingress_replicas == 2
    key = create("ci-bot")
    served(key)
    with (
        ClosedLoop(bearer(key), clients=3).running() as revoked_key,
        ClosedLoop(LOAD_HEADERS, clients=2).running() as other_key,
    ):
        wait_for(lambda: revoked_key.statuses().count(200) >= 20, 120, "20 answers to the key")
        sent_revoke = time.monotonic()
        gone = admin("DELETE", f"/v1/keys/{key['id']}")
        revoked_at = time.monotonic()
        wait_for(
            lambda: len(revoked_key.statuses(revoked_at + REFUSED_WITHIN_S)) >= 40,
            120,
            "40 requests sent a second after the revocation",
        )
    before = revoked_key.statuses(sent_before=sent_revoke)
    late = revoked_key.statuses(revoked_at + REFUSED_WITHIN_S)
    during = [(at - sent_revoke, s) for at, s in revoked_key.answers if at >= sent_revoke]
    accepted = [at for at, s in during if s == 200]
    print(
        f"\nrun-time key: {len(before)} answered before the revocation; of "
        f"{len(during)} sent after the DELETE was sent ({revoked_at - sent_revoke:.3f} s before "
        f"its answer), {len(accepted)} accepted (the last sent at "
        f"{max(accepted, default=float('nan')):+.3f} s); {len(late)} sent a second after its "
        f"answer, answered {sorted(set(late))}; the config key: {len(other_key.answers)} answers"
    )
    assert gone.status_code == 200, gone.text
    assert gone.json() == {"id": key["id"], "object": "api_key", "name": "ci-bot", "deleted": True}
    assert set(before) == {200}
    assert set(late) == {401}
    assert set(other_key.statuses()) == {200}
    listed = admin("GET", "/v1/keys").json()["data"]
    assert key["id"] not in [k["id"] for k in listed]
    assert not logs_holding(key["key"]), "the secret reached a log file"


def logs_holding(secret: str) -> list[Path]:
    """This cluster's log files (every process's: the ingress, the registry, Serve's proxy and
    controller, the raylet) that hold `secret`."""
    session = Path(ray._private.worker._global_node.get_session_dir_path())
    needle = secret.encode()
    return [f for f in (session / "logs").rglob("*") if f.is_file() and needle in f.read_bytes()]


def test_run_time_keys_outlive_their_registry_and_are_read_back_from_its_file(
    app: ClusterConfig,
) -> None:
    kept = create("kept-across")
    served(kept)
    name = registry_actor_name(APP, str(app.keys_db))
    first = ray.get_actor(name, namespace="serve")
    first_id: str = first._actor_id.hex()
    ray.kill(first, no_restart=True)  # as a GCS restart loses it: the actor and its memory
    # The replicas hold their copy: the key is served while no registry runs.
    assert set(chats(bearer(kept), 10)) == {200}

    def replaced() -> bool:
        try:
            now: str = ray.get_actor(name, namespace="serve")._actor_id.hex()
        except ValueError:  # none by that name yet
            return False
        return now != first_id

    wait_for(replaced, 60, "the replicas to start a new registry")
    listed = admin("GET", "/v1/keys").json()["data"]
    assert kept["id"] in [k["id"] for k in listed]  # read back from the SQLite file
    later = create("made-after")
    served(later)
    # The registry's refusals come back through the actor as they are (not a 500).
    taken = admin("POST", "/v1/keys", {"name": "made-after"})
    unknown = admin("PATCH", "/v1/keys/key_0000", {"rpm": 5})
    assert (taken.status_code, taken.json()["error"]["code"]) == (409, "key_name_taken")
    assert (unknown.status_code, unknown.json()["error"]["code"]) == (404, "not_found")
    assert admin("DELETE", f"/v1/keys/{kept['id']}").status_code == 200
    wait_for(lambda: chats(bearer(kept), 1) == [401], 30, "the revocation to be served")
    assert set(chats(bearer(kept), 10)) == {401}
