"""The CPU image serves: `make run`, its command, answers a chat through a published port.

The image (built by conftest.py from deploy/docker/Dockerfile.cpu) runs with a small config of
one vLLM engine and the llama.cpp fallback (image.yaml) mounted read-only and named with
CONFIG, as an operator would run it. Podman runs it with runc and this process's own rlimits:
podman's default ulimits are more than a machine without CAP_SYS_RESOURCE may grant, and crun
refuses cgroups v1 in hybrid mode. The container's processes are visible from here (its PID
namespace is a child of ours): the test finds the engines under `make run`. None can outlive the
container: the kernel ends every process of a PID namespace with its first one.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from deployments.fallback.supervisor import free_loopback_port
from tests.image.podman_cli import PODMAN_TIMEOUT_S, podman, run_flags
from tests.own_processes import SUITE_VARIABLE
from tests.waiting import wait_for

CONFIG = Path(__file__).with_name("image.yaml")
CONFIG_IN_CONTAINER = "/etc/gpu-pool-serve/image.yaml"
SUITE = "image"  # tests/own_processes.py: the container's processes are this suite's
READY_TIMEOUT_S = 900  # the engine loads in about a minute on 2 cores; Ray starts first
REPLY_TIMEOUT_S = 120
STOP_TIMEOUT_S = 30  # podman stop's grace before SIGKILL
SERVE_COMMAND = f"serve run cluster.app:build config={CONFIG_IN_CONTAINER}"
# Ray's title for the vLLM engine's replica, whose children are the engine: in the container
# vLLM's own titles (VLLM::EngineCore) do not show (its processes keep multiprocessing's).
ENGINE_REPLICA = "ray::ServeReplica:default:model:orchestrator@local"
LLAMA_SERVER = "llama-server"


def run_container(image: str, name: str, port: int) -> None:
    podman(
        "run", "--detach", "--name", name, *run_flags(),
        "--shm-size=2g",  # Ray's object store lives in /dev/shm (podman gives 64 MB)
        "--publish", f"127.0.0.1:{port}:8000",
        "--volume", f"{CONFIG}:{CONFIG_IN_CONTAINER}:ro",
        "--env", f"CONFIG={CONFIG_IN_CONTAINER}",
        "--env", f"{SUITE_VARIABLE}={SUITE}",
        image,
    )  # fmt: skip


def logs(name: str) -> str:
    done = subprocess.run(
        ["podman", "logs", "--tail", "80", name],
        capture_output=True, text=True, timeout=PODMAN_TIMEOUT_S, check=False,
    )  # fmt: skip
    kept = [x for x in (done.stdout + done.stderr).splitlines() if "CALL kv_cache" not in x]
    return "\n".join(kept)


def healthy(name: str, port: int) -> bool:
    """/healthz says ok; the test fails at once, with the container's log, if it has exited."""
    if podman("inspect", "--format", "{{.State.Running}}", name) != "true":
        pytest.fail(f"the container exited:\n{logs(name)}")
    try:
        answer = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5)
        return bool(answer.status_code == 200 and answer.json().get("status") == "ok")
    except (httpx.HTTPError, ValueError):
        return False


def wait_serving(name: str, port: int) -> None:
    try:
        wait_for(lambda: healthy(name, port), READY_TIMEOUT_S, "/healthz to say ok")
    except pytest.fail.Exception:
        print(logs(name))
        raise


def container_init(name: str) -> psutil.Process:
    """The container's first process as seen from here: its command, `make run`."""
    return psutil.Process(int(podman("inspect", "--format", "{{.State.Pid}}", name)))


def memory_peak(pid: int) -> str:
    """The highest memory use so far of the cgroup of `pid` (cgroups v1 or v2), page cache
    included (the model files it read): more than its processes held."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        candidates = {
            "memory": Path("/sys/fs/cgroup/memory", path.lstrip("/"), "memory.max_usage_in_bytes"),
            "": Path("/sys/fs/cgroup", path.lstrip("/"), "memory.peak"),
        }
        peak = candidates.get(controllers)
        if peak is not None and peak.is_file():
            return f"{int(peak.read_text()) / 2**30:.2f} GiB, page cache included"
    return "unknown"


def processes_under_make_run(name: str) -> list[psutil.Process]:
    """The container's `make run` and every process under it, after checking that they are what
    serves: `serve run` with the config it was given, the vLLM engine, llama.cpp's server."""
    init = container_init(name)
    assert init.cmdline() == ["make", "run"]
    under_make = [init, *init.children(recursive=True)]
    lines = {process: " ".join(process.cmdline()) for process in under_make}
    assert any(SERVE_COMMAND in line for line in lines.values()), lines
    assert any(LLAMA_SERVER in line for line in lines.values()), "no llama.cpp under make run"
    replicas = [process for process, line in lines.items() if ENGINE_REPLICA in line]
    assert [r for r in replicas if r.children()], "no vLLM engine process under make run"
    return under_make


@pytest.fixture
def container(cpu_image: str) -> Iterator[tuple[str, int]]:
    """The image running under a name of its own on a free port; removed whatever happens."""
    name, port = f"gps-image-test-{os.getpid()}", free_loopback_port()
    try:
        run_container(cpu_image, name, port)
        yield name, port
    finally:
        subprocess.run(
            ["podman", "rm", "--force", "--time", str(STOP_TIMEOUT_S), name],
            capture_output=True, timeout=PODMAN_TIMEOUT_S + STOP_TIMEOUT_S, check=False,
        )  # fmt: skip


def ask(port: int) -> httpx.Response:
    return httpx.post(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        json={
            "model": "orchestrator",
            "messages": [{"role": "user", "content": "Say hello."}],
            "max_tokens": 16,
        },
        timeout=REPLY_TIMEOUT_S,
    )


def test_make_run_in_the_cpu_image_answers_a_chat(
    container: tuple[str, int],
) -> None:
    name, port = container
    started = time.monotonic()
    wait_serving(name, port)
    print(f"the container served {time.monotonic() - started:.0f} s after its start")

    reply = ask(port)
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["message"]["content"].strip()
    assert reply.headers["X-Backend"] == "orchestrator@local"

    under_make = processes_under_make_run(name)
    print(f"container memory peak: {memory_peak(under_make[0].pid)}")
