"""The `ray up` provider for one machine: what `ray up` and `ray down` see of the head, and the
command runner that stands in for SSH. No Ray is started: a listening socket plays the GCS."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ray.autoscaler.tags import (
    NODE_KIND_HEAD,
    NODE_KIND_WORKER,
    STATUS_SETTING_UP,
    TAG_RAY_LAUNCH_CONFIG,
    TAG_RAY_NODE_KIND,
    TAG_RAY_NODE_STATUS,
)

from cluster.local_nodes import LocalCommandRunner, LocalNodeProvider, ProcessRunnerError

HEAD = {TAG_RAY_NODE_KIND: NODE_KIND_HEAD}


@pytest.fixture
def gcs() -> Iterator[socket.socket]:
    listener = socket.create_server(("127.0.0.1", 0))
    yield listener
    listener.close()


def address(listener: socket.socket) -> str:
    return f"127.0.0.1:{listener.getsockname()[1]}"


def closed_port() -> str:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        return address(listener)


class Stops(LocalNodeProvider):
    stopped = 0

    @staticmethod
    def stop_ray() -> None:
        Stops.stopped += 1


def provider(tmp_path: Path, gcs_address: str, monkeypatch: pytest.MonkeyPatch) -> Stops:
    monkeypatch.setenv("RAY_FAKE_CLUSTER", "1")
    config: dict[str, Any] = {"gcs_address": gcs_address, "state_dir": str(tmp_path)}
    return Stops(config, "test")


def test_with_no_gcs_there_is_no_head_and_a_stale_record_goes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stale = tmp_path / "gps-local-nodes-test.json"
    stale.write_text('{"ray-node-type": "head"}')
    assert provider(tmp_path, closed_port(), monkeypatch).non_terminated_nodes(HEAD) == []
    assert not stale.exists()


def test_a_head_ray_up_created_is_seen_by_the_next_process_while_its_gcs_answers(
    tmp_path: Path, gcs: socket.socket, monkeypatch: pytest.MonkeyPatch
) -> None:
    up = provider(tmp_path, address(gcs), monkeypatch)
    up.create_node({}, {**HEAD, TAG_RAY_LAUNCH_CONFIG: "hash-1"}, 1)
    (head,) = up.non_terminated_nodes(HEAD)
    up.set_node_tags(head, {TAG_RAY_NODE_STATUS: STATUS_SETTING_UP})

    again = provider(tmp_path, address(gcs), monkeypatch)
    assert again.non_terminated_nodes(HEAD) == [head]
    assert again.node_tags(head)[TAG_RAY_LAUNCH_CONFIG] == "hash-1"
    assert again.node_tags(head)[TAG_RAY_NODE_STATUS] == STATUS_SETTING_UP


def test_a_head_started_by_hand_is_listed_without_a_launch_hash(
    tmp_path: Path, gcs: socket.socket, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`ray up` then sees a head of another config and replaces it."""
    seen = provider(tmp_path, address(gcs), monkeypatch)
    (head,) = seen.non_terminated_nodes(HEAD)
    assert TAG_RAY_LAUNCH_CONFIG not in seen.node_tags(head)


def test_terminating_the_head_stops_ray_here_and_forgets_it(
    tmp_path: Path, gcs: socket.socket, monkeypatch: pytest.MonkeyPatch
) -> None:
    up = provider(tmp_path, address(gcs), monkeypatch)
    up.create_node({}, {**HEAD, TAG_RAY_LAUNCH_CONFIG: "hash-1"}, 1)
    (head,) = up.non_terminated_nodes(HEAD)
    before = Stops.stopped
    up.terminate_node(head)
    assert Stops.stopped == before + 1
    assert up.non_terminated_nodes(HEAD) == []
    assert not (tmp_path / "gps-local-nodes-test.json").exists()


def test_workers_are_the_autoscalers_to_launch(
    tmp_path: Path, gcs: socket.socket, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(NotImplementedError):
        provider(tmp_path, address(gcs), monkeypatch).create_node(
            {}, {TAG_RAY_NODE_KIND: NODE_KIND_WORKER}, 1
        )


def test_the_runner_runs_here_with_the_environment_it_is_given() -> None:
    """As over Ray's SSH runner, values arrive JSON-encoded (how the updater passes a node's
    resources to `ray start`)."""
    out = LocalCommandRunner().run(
        "echo $RAY_OVERRIDE_RESOURCES",
        with_output=True,
        environment_variables={"RAY_OVERRIDE_RESOURCES": {"CPU": 2, "pool_cloud": 1}},
    )
    assert out == '{"CPU":2,"pool_cloud":1}\n'


def test_a_failing_command_raises_with_its_exit_code() -> None:
    with pytest.raises(ProcessRunnerError) as failed:
        LocalCommandRunner().run("exit 3")
    assert failed.value.returncode == 3


def test_file_mounts_are_copied_here(tmp_path: Path) -> None:
    source = tmp_path / "src"
    (source / "sub").mkdir(parents=True)
    (source / "sub" / "a.txt").write_text("a")
    single = tmp_path / "config.yaml"
    single.write_text("b")
    runner = LocalCommandRunner()
    runner.run_rsync_up(f"{source}/", str(tmp_path / "dst" / "tree"))
    runner.run_rsync_up(str(single), str(tmp_path / "dst" / "deep" / "config.yaml"))
    assert (tmp_path / "dst" / "tree" / "sub" / "a.txt").read_text() == "a"
    assert (tmp_path / "dst" / "deep" / "config.yaml").read_text() == "b"
