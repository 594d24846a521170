"""A Ray node provider for `ray up` on one machine: Ray's own `fake_multinode` provider, plus
what Ray's cluster launcher needs of a provider and that one lacks (Ray 2.60).

Ray documents `fake_multinode` only behind `RAY_FAKE_CLUSTER=1 ray start --head
--autoscaling-config=...`; `ray up` cannot drive it: the wheel lacks the defaults file `ray up`
reads for it, its head exists only in the autoscaler's memory (so `ray up` finds a head with no
launch hash, decides to relaunch it and fails on a missing key), its tags are read-only, and
the only command runner it offers is SSH. This subclass keeps Ray's worker launching (each
pool node is a raylet the autoscaler starts on this machine, with its node type's resources)
and adds:

- the head as a record in a small state file (what a cloud's API would answer), listed while
  `ray up` has launched it and its GCS answers; a head started by hand is listed with no
  launch hash, so `ray up` replaces it, as it would replace a cloud head of another config;
- a command runner that runs the launcher's commands on this machine and copies file mounts
  locally (`ray up`, `ray exec`, `ray down` work unchanged).

`ray_configs/cluster.local.yaml` names it: `provider: {type: external, module:
cluster.local_nodes.LocalNodeProvider}`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ray.autoscaler._private.command_runner import _with_environment_variables
from ray.autoscaler._private.fake_multi_node.node_provider import (
    FAKE_HEAD_NODE_TYPE,
    FakeMultiNodeProvider,
)
from ray.autoscaler.command_runner import CommandRunnerInterface
from ray.autoscaler.tags import (
    NODE_KIND_HEAD,
    STATUS_UP_TO_DATE,
    TAG_RAY_NODE_KIND,
    TAG_RAY_NODE_NAME,
    TAG_RAY_NODE_STATUS,
    TAG_RAY_USER_NODE_TYPE,
)
from ray.util import get_node_ip_address

from cluster.ray_runtime import gcs_answers

__all__ = ["LocalCommandRunner", "LocalNodeProvider", "ProcessRunnerError"]

DEFAULT_GCS_PORT = 6379


class ProcessRunnerError(Exception):
    """A command failed; the attributes the updater reads of Ray's own error of this name."""

    def __init__(self, command: str, returncode: int) -> None:
        super().__init__(f"command failed with exit code {returncode}: {command}")
        self.cmd = command
        self.returncode = returncode
        self.msg_type = "ssh_command_failed"
        self.special_case = None


def stop_ray_here() -> None:
    subprocess.run(["ray", "stop", "--force"], check=False, capture_output=True)


class LocalNodeProvider(FakeMultiNodeProvider):  # type: ignore[misc]
    # How the head (and with it every node here) is stopped; Ray builds the provider, so tests
    # replace this on a subclass.
    stop_ray: Callable[[], None] = staticmethod(stop_ray_here)

    def __init__(self, provider_config: dict[str, Any], cluster_name: str) -> None:
        # The fake provider refuses to start without it; this provider is that cluster.
        os.environ.setdefault("RAY_FAKE_CLUSTER", "1")
        super().__init__(provider_config, cluster_name)
        self._gcs_address = provider_config.get("gcs_address") or (
            f"{get_node_ip_address()}:{DEFAULT_GCS_PORT}"
        )
        state_dir = provider_config.get("state_dir") or Path(tempfile.gettempdir()) / "ray"
        self._state = Path(state_dir) / f"gps-local-nodes-{cluster_name}.json"
        head = self._running_head()
        if head is None:
            del self._nodes[self._head_node_id]
        else:
            self._nodes[self._head_node_id] = {"tags": head}

    def _running_head(self) -> dict[str, str] | None:
        """The head's tags while its GCS answers: as `ray up` launched it, or with no launch
        hash for a head started by hand. A record whose GCS is gone is stale and dropped."""
        if not gcs_answers(self._gcs_address):
            self._state.unlink(missing_ok=True)
            return None
        try:
            tags: dict[str, str] = json.loads(self._state.read_text())
        except (OSError, ValueError):
            tags = {
                TAG_RAY_NODE_KIND: NODE_KIND_HEAD,
                TAG_RAY_USER_NODE_TYPE: FAKE_HEAD_NODE_TYPE,
                TAG_RAY_NODE_NAME: self._head_node_id,
                TAG_RAY_NODE_STATUS: STATUS_UP_TO_DATE,
            }
        return tags

    def _save_head(self) -> None:
        self._state.parent.mkdir(parents=True, exist_ok=True)
        self._state.write_text(json.dumps(self._nodes[self._head_node_id]["tags"]))

    def create_node(
        self, node_config: dict[str, Any], tags: dict[str, str], count: int
    ) -> dict[str, Any] | None:
        """`ray up` asks for a head: record it; its `head_start_ray_commands` start it. Workers
        come from the autoscaler, through Ray's `create_node_with_resources_and_labels`."""
        if tags.get(TAG_RAY_NODE_KIND) != NODE_KIND_HEAD:
            raise NotImplementedError("worker nodes are launched by the autoscaler")
        with self.lock:
            self._nodes[self._head_node_id] = {"tags": dict(tags)}
            self._save_head()
        return None

    def set_node_tags(self, node_id: str, tags: dict[str, str]) -> None:
        with self.lock:
            self._nodes[node_id]["tags"].update(tags)
            if node_id == self._head_node_id:
                self._save_head()

    def terminate_node(self, node_id: str) -> None:
        if node_id != self._head_node_id:
            super().terminate_node(node_id)
            return
        # Every node of this cluster is a process here: stopping Ray stops them all.
        with self.lock:
            self._nodes.pop(node_id, None)
            self._state.unlink(missing_ok=True)
        self.stop_ray()

    def get_command_runner(
        self,
        log_prefix: str,
        node_id: str,
        auth_config: dict[str, Any],
        cluster_name: str,
        process_runner: Any,
        use_internal_ip: bool,
        docker_config: dict[str, Any] | None = None,
    ) -> CommandRunnerInterface:
        return LocalCommandRunner()


class LocalCommandRunner(CommandRunnerInterface):  # type: ignore[misc]
    """Runs the launcher's commands on this machine, in a login-free bash, as SSH would."""

    def run(
        self,
        cmd: str | None = None,
        timeout: int = 120,
        exit_on_fail: bool = False,
        port_forward: Any = None,
        with_output: bool = False,
        environment_variables: dict[str, object] | None = None,
        run_env: str = "auto",
        ssh_options_override_ssh_key: str = "",
        shutdown_after_run: bool = False,
    ) -> str:
        # `timeout` bounds SSH's connect, not the command (setup commands may run for minutes).
        if not cmd:
            return ""
        if environment_variables:
            cmd = _with_environment_variables(cmd, environment_variables)
        done = subprocess.run(
            ["bash", "-c", cmd],
            check=False,
            stdout=subprocess.PIPE if with_output else None,
        )
        if done.returncode != 0:
            raise ProcessRunnerError(cmd, done.returncode)
        return done.stdout.decode() if with_output else ""

    def run_rsync_up(self, source: str, target: str, options: dict[str, Any] | None = None) -> None:
        copy(Path(source), Path(target).expanduser())

    def run_rsync_down(
        self, source: str, target: str, options: dict[str, Any] | None = None
    ) -> None:
        copy(Path(source).expanduser(), Path(target))

    def remote_shell_command_str(self) -> str:
        return "bash"

    def run_init(
        self, *, as_head: bool, file_mounts: dict[str, str], sync_run_yet: bool
    ) -> bool | None:
        return None


def copy(source: Path, target: Path) -> None:
    """rsync's `source target` on one machine: a folder's contents, or a file."""
    if source.resolve() == target.resolve():
        return
    if source.is_dir():
        shutil.copytree(source, target, dirs_exist_ok=True)
    else:
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)
