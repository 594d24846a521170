"""Checks for a lent NVIDIA machine (`device` tool): real NVML readings while another process
holds memory, and a real CUDA out-of-memory error as the replicas' containment sees it.

Needs torch with CUDA and nvidia-ml-py, nothing else of ours but two pure modules. Run there as
`PYTHONPATH=. python3 -m pytest -c /dev/null -s tests/gpu`; skipped anywhere without a GPU.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from autoscale.vram import NvmlSource
from core.types import GIB
from policy.oom import error_kind

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine"),
]

HOLDER = """
import sys, time, torch
held = torch.empty(int(float(sys.argv[1]) * 2**30), dtype=torch.uint8, device="cuda")
print("held", flush=True)
time.sleep(600)
"""


def hold(gib: float, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """Another process holding `gib` of GPU memory, as a second tenant of the GPU would."""
    process = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(gib)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "held"
    return process


@pytest.fixture
def holder() -> Iterator[list[subprocess.Popen[str]]]:
    held: list[subprocess.Popen[str]] = []
    yield held
    for process in held:
        process.kill()
        process.wait()


def test_nvml_sees_another_process_take_memory_and_give_it_back(
    holder: list[subprocess.Popen[str]],
) -> None:
    before = NvmlSource().read()
    assert before.has_gpu, before.error
    timed = time.perf_counter()
    for _ in range(10):
        NvmlSource().read()
    per_read_ms = (time.perf_counter() - timed) * 100
    print(f"\none NVML reading (init, read, shutdown) takes {per_read_ms:.1f} ms")
    started = time.perf_counter()
    holder.append(hold(20))
    during = NvmlSource().read()
    read_s = time.perf_counter() - started
    holder[0].kill()
    holder[0].wait()
    time.sleep(1)
    after = NvmlSource().read()
    print(
        f"\nNVML {before.gpus[0].name}: free {before.free_bytes / GIB:.2f} GiB before, "
        f"{during.free_bytes / GIB:.2f} while another process held 20 GiB, "
        f"{after.free_bytes / GIB:.2f} after; processes while held: "
        f"{[(p.pid, p.used_bytes) for p in during.gpus[0].processes]}; "
        f"allocate+read took {read_s:.2f} s"
    )
    assert before.free_bytes - during.free_bytes >= 20 * GIB
    assert after.free_bytes >= during.free_bytes + 19 * GIB
    pids = {p.pid for p in during.gpus[0].processes}
    assert holder[0].pid in pids or not pids  # some containers hide other processes' pids


def test_a_real_cuda_out_of_memory_is_recognised_as_oom(
    holder: list[subprocess.Popen[str]],
) -> None:
    free = NvmlSource().read().free_bytes
    holder.append(hold(free / GIB - 2))  # leave about 2 GiB
    with pytest.raises(torch.OutOfMemoryError) as caught:
        torch.empty(8 * GIB, dtype=torch.uint8, device="cuda")
    print(
        f"\nreal CUDA OOM: {type(caught.value).__module__}.{type(caught.value).__name__}: "
        f"{str(caught.value).splitlines()[0]}"
    )
    assert error_kind(caught.value) == "oom"
    # vLLM's engine dies of it in its EngineCore process; the frontend raises EngineDeadError
    # with the OOM as its cause: still an OOM to the containment.
    dead = type("EngineDeadError", (Exception,), {})("EngineCore encountered an issue.")
    dead.__cause__ = caught.value
    assert error_kind(dead) == "oom"
    # The process that hit it still works once memory is back: containment can answer.
    holder[0].kill()
    holder[0].wait()
    assert torch.ones(4, device="cuda").sum().item() == 4


def test_a_real_vram_drop_decides_an_offload_and_recovery_a_restore(
    holder: list[subprocess.Popen[str]],
) -> None:
    from autoscale.probe import pool_free_bytes
    from policy.placement import History, ModelPlacement, PlacementPolicy, decide

    policy = PlacementPolicy.from_gb(6, 12, cooldown_s=120, min_away_s=60)
    reasoning = ModelPlacement("reasoning", 3, ("local", "cloud"), "local")
    cloud_free = {"cloud": 40 * GIB}  # the other pool, as its own probe would report it

    def free_now() -> dict[str, int | None]:
        reading = NvmlSource(node="gpu-node").read()
        return {**pool_free_bytes([reading], {"gpu-node": {"local"}}), **cloud_free}

    calm = decide(free_now(), [reasoning], History(), 0, policy)
    started = time.perf_counter()
    holder.append(hold(NvmlSource().read().free_bytes / GIB - 3))  # leave about 3 GiB
    squeezed = free_now()
    [move] = decide(squeezed, [reasoning], History(), 0, policy).moves
    decided_s = time.perf_counter() - started
    holder[0].kill()
    holder[0].wait()
    time.sleep(1)
    away = ModelPlacement("reasoning", 3, ("local", "cloud"), "cloud")
    back = decide(free_now(), [away], History({}, {"reasoning": 0}), 120, policy)
    print(
        f"\nplacement on real NVML: local free {(squeezed['local'] or 0) / GIB:.2f} GiB "
        "while held -> "
        f"{move.kind} {move.model} {move.source}->{move.target} ({move.reason}); "
        f"allocation to decision {decided_s:.2f} s; after release: "
        f"{[(m.kind, m.source, m.target) for m in back.moves]}"
    )
    assert calm.moves == ()
    assert (move.kind, move.source, move.target) == ("offload", "local", "cloud")
    assert [(m.kind, m.target) for m in back.moves] == [("restore", "local")]


def test_the_capacity_commands_gpu_memory_follows_a_real_allocation(
    holder: list[subprocess.Popen[str]],
) -> None:
    """`python -m cluster.capacity` measures a GPU engine's bytes per token from the GPU memory
    two engines take (`_memory_used("gpu")`, NVML's used bytes): it must see another process's
    allocation at its size, and the GPU's total must be the one CUDA reports."""
    from cluster.capacity import _first_gpu, _memory_used

    before = _memory_used("gpu")
    holder.append(hold(8))
    during = _memory_used("gpu")
    holder[0].kill()
    holder[0].wait()
    time.sleep(1)
    after = _memory_used("gpu")
    total = _first_gpu().total_bytes
    cuda_total = torch.cuda.mem_get_info()[1]
    print(
        f"\ncapacity's GPU reading: used {before / GIB:.2f} GiB before, {during / GIB:.2f} "
        f"while another process held 8 GiB, {after / GIB:.2f} after; total {total / GIB:.2f} "
        f"GiB by NVML, {cuda_total / GIB:.2f} by CUDA"
    )
    # The holder's 8 GiB and its own CUDA context (about half a GiB).
    assert 8 * GIB <= during - before <= 9 * GIB
    assert after - before < GIB
    assert abs(total - cuda_total) <= 0.01 * cuda_total


def test_a_probe_keeps_the_fallback_engines_vram_while_it_restarts(
    holder: list[subprocess.Popen[str]],
) -> None:
    """A process started with the fallback engine's environment (`gpu_env` with layers asked
    for) holds 4 GiB: the node's probe finds it by its marker and NVML's per-process count, and
    once it dies keeps those 4 GiB out of what placement may fill (`policy.fallback_vram`)."""
    from autoscale.probe import VramProbe
    from autoscale.vram import NodeReading
    from deployments.fallback.engine import gpu_env

    probe = VramProbe("gpu-node")
    calm = NodeReading.from_json(probe.read())
    holder.append(hold(4, env=gpu_env(n_gpu_layers=-1)))
    running = NodeReading.from_json(probe.read())
    holder[0].kill()
    holder[0].wait()
    time.sleep(1)
    restarting = NodeReading.from_json(probe.read())
    print(
        f"\nfallback share on real NVML: held {running.fallback_held_bytes / GIB:.2f} GiB while "
        f"it ran; after its death free {restarting.free_bytes / GIB:.2f} GiB, withheld "
        f"{restarting.fallback_withheld_bytes / GIB:.2f}, placeable "
        f"{restarting.placeable_bytes / GIB:.2f} (before it started: {calm.free_bytes / GIB:.2f})"
    )
    if not running.gpus[0].processes:
        pytest.skip("this container hides GPU processes from NVML: no per-process count")
    assert 4 * GIB <= running.fallback_held_bytes <= 5 * GIB  # its 4 GiB and its CUDA context
    assert restarting.fallback_withheld_bytes == running.fallback_held_bytes
    assert abs(restarting.placeable_bytes - running.placeable_bytes) < GIB // 4
