"""Where a Serve replica's CPU goes: py-spy (installed with Ray) samples the running process
from outside, and the samples are summed per function.

`record` starts `py-spy record --format raw` on a process for a while (no change to the process,
no restart); `top` reads the collapsed stacks it wrote: for each function (file and name, lines
merged), the share of samples where it is on the stack (inclusive) and where it is the frame
running (self). bench/pace.py records the gateway's ingress replica under load with
`--profile`.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import psutil

_LINE = re.compile(r"^(?P<stack>.*) (?P<count>\d+)$")
_FRAME_LINE = re.compile(r":\d+\)$")
SITE = re.compile(r"\([^()]*/(site-packages|python3\.\d+)/")


@dataclass(frozen=True)
class Entry:
    function: str
    inclusive: float  # share of samples with it on the stack
    self_share: float  # share of samples with it running


def pid_of(title: str) -> int:
    """The one process whose command line (a Ray worker's title) contains `title`."""
    found = [
        p.pid
        for p in psutil.process_iter(["cmdline"])
        if title in " ".join(p.info["cmdline"] or ())
    ]
    if len(found) != 1:
        raise RuntimeError(f"{len(found)} processes titled {title!r}, one expected")
    return found[0]


def record(pid: int, seconds: int, out: Path, rate: int = 250) -> subprocess.Popen[bytes]:
    """py-spy sampling `pid` for `seconds` into `out` (collapsed stacks), started now."""
    binary = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    command = [binary, "record", "--pid", str(pid), "--duration", str(seconds)]
    # --gil: only the thread holding the GIL, so a sample is Python running, not waiting for it.
    command += ["--rate", str(rate), "--format", "raw", "--output", str(out)]
    command += ["--gil", "--nonblocking"]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def top(raw: Path, count: int = 15) -> tuple[int, list[Entry], list[Entry]]:
    """The samples, and the functions most on the stack and most running."""
    inclusive: Counter[str] = Counter()
    running: Counter[str] = Counter()
    samples = 0
    for line in raw.read_text().splitlines():
        match = _LINE.match(line.strip())
        if match is None:
            continue
        n = int(match["count"])
        frames = [_function(f) for f in match["stack"].split(";") if f]
        if not frames:
            continue
        samples += n
        for function in set(frames):
            inclusive[function] += n
        running[frames[-1]] += n

    def entries(counter: Counter[str]) -> list[Entry]:
        return [
            Entry(f, inclusive[f] / samples, running[f] / samples)
            for f, _ in counter.most_common(count)
        ]

    if not samples:
        return 0, [], []
    return samples, entries(inclusive), entries(running)


def _function(frame: str) -> str:
    """`name (path/file.py:123)` as `name (file path after site-packages)`, lines merged."""
    return SITE.sub("(", _FRAME_LINE.sub(")", frame.strip()))


def print_top(title: str, raw: Path, count: int = 15) -> None:
    samples, on_stack, running = top(raw, count)
    print(f"\nprofile of {title}: {samples} samples (py-spy, {raw})")
    print("| function | on the stack | running |")
    print("|---|---:|---:|")
    seen = set()
    for entry in running + on_stack:  # what runs first, then what holds the stack
        if entry.function in seen:
            continue
        seen.add(entry.function)
        print(f"| `{entry.function}` | {entry.inclusive:.1%} | {entry.self_share:.1%} |")
