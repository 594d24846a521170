"""The provisioners against real processes: small scripts, and a stand-in Terraform CLI that
answers in Terraform's documented machine-readable UI (tests/fakes/terraform_cli.py)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import stat
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from autoscale.provisioners import (
    Provisioner,
    ProvisionFailed,
    ProvisionRequest,
    StandingRequest,
    process,
    provisioner_for,
)
from autoscale.provisioners.ray_autoscaler import AutoscalerRequest
from core.config import (
    CommandProvisioner,
    NoProvisioner,
    RayAutoscalerProvisioner,
    TerraformProvisioner,
)

FAKE_TERRAFORM = Path(__file__).parents[1] / "fakes" / "terraform_cli.py"


def request(pool: str = "cloud", nodes: int = 1, attempt: int = 1) -> ProvisionRequest:
    return ProvisionRequest(pool, f"pool_{pool}", nodes, "10.0.0.1:6379", attempt)


def script(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / name
    path.write_text(body)
    return path


def command(*argv: str, **env: str) -> CommandProvisioner:
    return CommandProvisioner(type="command", command=argv, env=env)


def parent_and_child(tmp_path: Path, name: str, first: str = "", child_args: str = "") -> Path:
    """A command that starts a child of its own, writes both pids to the returned file and
    sleeps: what a cancel must end, grandchild included."""
    pids = tmp_path / "pids"
    script(
        tmp_path,
        name,
        f"import os, signal, subprocess, sys, time\n{first}"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']"
        f"{child_args})\n"
        f"open({str(pids)!r}, 'w').write(f'{{os.getpid()}} {{child.pid}}')\n"
        "time.sleep(600)\n",
    )
    return pids


async def both_running(pids: Path) -> None:
    async with asyncio.timeout(60):
        # Another process writes it; a small file, read between sleeps.
        while not pids.exists() or len(pids.read_text().split()) < 2:  # noqa: ASYNC110, ASYNC240
            await asyncio.sleep(0.05)


@contextlib.contextmanager
def killed_after(pids: Path) -> Iterator[None]:
    """Whatever the test found, nothing of its processes is left running."""
    try:
        yield
    finally:
        for pid in map(int, pids.read_text().split()) if pids.exists() else ():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_the_command_gets_the_pool_in_its_environment(tmp_path: Path) -> None:
    seen = tmp_path / "seen.json"
    job = script(
        tmp_path,
        "job.py",
        "import json, os, sys\n"
        f"json.dump({{k: v for k, v in os.environ.items() if k.startswith(('GPS_', 'EXTRA'))}}, "
        f"open({str(seen)!r}, 'w'))\n"
        "print('noise')\nprint('node asked for')\n",
    )
    provisioner = provisioner_for(command(sys.executable, "job.py", EXTRA="1"), tmp_path)
    result = asyncio.run(provisioner.provision(request(nodes=2, attempt=3)))
    assert result.detail == "node asked for"
    assert job.exists()
    assert json.loads(seen.read_text()) == {
        "GPS_POOL": "cloud",
        "GPS_RAY_ADDRESS": "10.0.0.1:6379",
        "GPS_POOL_RESOURCE": "pool_cloud",
        "GPS_NODES": "2",
        "GPS_ATTEMPT": "3",
        "EXTRA": "1",
    }


def test_a_relative_command_runs_from_the_config_folder(tmp_path: Path) -> None:
    tool = script(tmp_path, "join.sh", "#!/bin/sh\necho joined from $(pwd)\n")
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    provisioner = provisioner_for(command("./join.sh"), tmp_path)
    result = asyncio.run(provisioner.provision(request()))
    assert result.detail == f"joined from {tmp_path}"


def test_a_failing_command_says_its_exit_code_and_the_end_of_its_stderr(tmp_path: Path) -> None:
    lines = "".join(f"print('line {n}', file=sys.stderr)\n" for n in range(50))
    script(tmp_path, "fail.py", f"import sys\n{lines}sys.exit(3)\n")
    provisioner = provisioner_for(command(sys.executable, "fail.py"), tmp_path)
    with pytest.raises(ProvisionFailed, match=r"exited 3: .*line 49") as failed:
        asyncio.run(provisioner.provision(request()))
    assert "line 10 " not in str(failed.value) + " "  # only the tail


def test_a_missing_command_is_a_failed_attempt(tmp_path: Path) -> None:
    provisioner = provisioner_for(command("/no/such/provisioner"), tmp_path)
    with pytest.raises(ProvisionFailed, match="cannot run /no/such/provisioner"):
        asyncio.run(provisioner.provision(request()))


def test_a_cancelled_command_leaves_no_process_behind(tmp_path: Path) -> None:
    pids = parent_and_child(tmp_path, "hang.py")
    provisioner = provisioner_for(command(sys.executable, "hang.py"), tmp_path)
    with killed_after(pids):
        asyncio.run(cancelled_while_running(provisioner, pids))
        assert_gone(pids)


async def cancelled_while_running(
    provisioner: Provisioner, pids: Path, then_again_after_s: float | None = None
) -> None:
    """The provisioning cancelled once its command and that one's child run (and, with
    `then_again_after_s`, cancelled again that long after: a shutdown's second cancel); it
    ends cancelled."""
    task = asyncio.create_task(provisioner.provision(request()))
    await both_running(pids)
    task.cancel()
    if then_again_after_s is not None:
        await asyncio.sleep(then_again_after_s)
        task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def assert_gone(pids: Path) -> None:
    for pid in map(int, pids.read_text().split()):
        deadline = time.monotonic() + 10
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(pid), f"process {pid} outlived the cancelled provisioner"


def alive(pid: int) -> bool:
    """Running; a zombie was killed (its parent, gone too, cannot reap it here)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_command_cancelled_while_its_pipes_connect_leaves_no_process_behind(
    tmp_path: Path,
) -> None:
    """The child runs before asyncio has connected its pipes: on a loaded machine its own child
    can be running by then (a make test run waited 600 s here for one to end by itself)."""
    # The grandchild's output goes elsewhere, so the pipes close with the child.
    pids = parent_and_child(
        tmp_path, "hang.py", child_args=", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL"
    )
    provisioner = provisioner_for(command(sys.executable, "hang.py"), tmp_path)
    held: list[bool] = []

    async def cut_short() -> None:
        loop = asyncio.get_running_loop()
        connect = loop.connect_read_pipe
        cancelled = asyncio.Event()

        async def late_connect(*args: Any, **kwargs: Any) -> Any:
            # The pipes connect only once the grandchild runs and the cancel has been sent.
            held.append(True)
            await cancelled.wait()
            return await connect(*args, **kwargs)

        loop.connect_read_pipe = late_connect  # type: ignore[method-assign]
        task = asyncio.create_task(provisioner.provision(request()))
        await both_running(pids)
        task.cancel()
        cancelled.set()
        with pytest.raises(asyncio.CancelledError):
            await task

    with killed_after(pids):
        asyncio.run(cut_short())
        assert held, "asyncio no longer connects a child's pipes through connect_read_pipe"
        assert_gone(pids)


def test_a_second_cancel_while_the_group_is_ended_still_ends_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A shutdown cancels every task again: the SIGKILL after the grace must still come."""
    monkeypatch.setattr(process, "KILL_GRACE_S", 1.0)
    ignore_term = "signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the child inherits it\n"
    pids = parent_and_child(tmp_path, "stubborn.py", first=ignore_term)
    provisioner = provisioner_for(command(sys.executable, "stubborn.py"), tmp_path)
    with killed_after(pids):
        # The second cancel inside the grace: SIGTERM sent, and ignored.
        asyncio.run(cancelled_while_running(provisioner, pids, then_again_after_s=0.3))
        assert_gone(pids)


def test_no_provisioner_always_fails_and_says_so(tmp_path: Path) -> None:
    provisioner = provisioner_for(NoProvisioner(), tmp_path)
    with pytest.raises(ProvisionFailed, match="no provisioner"):
        asyncio.run(provisioner.provision(request()))


def test_the_autoscaler_gets_every_pools_bundles_in_one_standing_request() -> None:
    calls: list[list[dict[str, float]]] = []

    def request_resources(bundles: list[dict[str, float]]) -> None:
        calls.append(bundles)

    standing = StandingRequest()
    cloud = AutoscalerRequest(
        RayAutoscalerProvisioner(type="ray_autoscaler", nodes=2, resources={"GPU": 1}),
        standing,
        request_resources,
    )
    mesh = AutoscalerRequest(
        RayAutoscalerProvisioner(type="ray_autoscaler"), standing, request_resources
    )
    asyncio.run(cloud.provision(request("cloud", nodes=2)))
    asyncio.run(mesh.provision(request("mesh")))
    assert calls[-1] == [
        {"pool_cloud": 1.0, "GPU": 1.0},
        {"pool_cloud": 1.0, "GPU": 1.0},
        {"pool_mesh": 1.0},
    ]


def test_an_autoscaler_error_is_a_failed_attempt() -> None:
    def refuse(bundles: list[dict[str, float]]) -> None:
        raise ConnectionError("GCS unreachable")

    provisioner = AutoscalerRequest(
        RayAutoscalerProvisioner(type="ray_autoscaler"), StandingRequest(), refuse
    )
    with pytest.raises(ProvisionFailed, match="GCS unreachable"):
        asyncio.run(provisioner.provision(request()))


def terraform(tmp_path: Path, **variables: str) -> tuple[TerraformProvisioner, Path]:
    """A terraform binary that runs the stand-in CLI; its calls logged to calls.jsonl."""
    wrapper = tmp_path / "terraform"
    log = tmp_path / "calls.jsonl"
    wrapper.write_text(
        f'#!/bin/sh\nTF_FAKE_LOG={log} exec {sys.executable} {FAKE_TERRAFORM} "$@"\n'
    )
    wrapper.chmod(0o755)
    (tmp_path / "module").mkdir()
    config = TerraformProvisioner(
        type="terraform",
        module_dir="module",
        nodes=2,
        variables=variables,
        binary=str(wrapper),
    )
    return config, log


def calls(log: Path) -> list[list[str]]:
    return [json.loads(line) for line in log.read_text().splitlines()]


def test_terraform_applies_with_the_node_count_and_reads_the_outputs(tmp_path: Path) -> None:
    config, log = terraform(tmp_path, head_address="10.0.0.1:6379")
    result = asyncio.run(provisioner_for(config, tmp_path).provision(request(nodes=2)))
    assert result.detail == "terraform: 2 added, 0 changed, 0 destroyed (node_count 2)"
    assert result.outputs["node_addresses"] == ["10.1.0.1", "10.1.0.2"]
    init, apply = calls(log)
    module = str(tmp_path / "module")
    assert init[:2] == [f"-chdir={module}", "init"]
    assert apply[:2] == [f"-chdir={module}", "apply"]
    assert "-auto-approve" in apply
    assert "-json" in apply
    assert _vars(apply) == {"node_count": "2", "head_address": "10.0.0.1:6379"}


def test_terraform_init_runs_once(tmp_path: Path) -> None:
    config, log = terraform(tmp_path)
    provisioner = provisioner_for(config, tmp_path)
    asyncio.run(provisioner.provision(request()))
    asyncio.run(provisioner.provision(request(attempt=2)))
    assert [c[1] for c in calls(log)] == ["init", "apply", "apply"]


def test_terraform_errors_come_back_as_their_diagnostics(tmp_path: Path) -> None:
    config, _ = terraform(tmp_path, fail="quota")
    with pytest.raises(ProvisionFailed, match=r"exited 1: Error launching source instance"):
        asyncio.run(provisioner_for(config, tmp_path).provision(request()))


def _vars(argv: list[str]) -> dict[str, Any]:
    pairs = [argv[i + 1] for i, arg in enumerate(argv) if arg == "-var"]
    return dict(pair.split("=", 1) for pair in pairs)
