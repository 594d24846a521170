"""What this node's CPU computes natively, read from /proc/cpuinfo (Linux's flags line)."""

from __future__ import annotations

import platform
from pathlib import Path

from policy.cpu_dtype import has_native_bf16

CPUINFO = Path("/proc/cpuinfo")


def cpu_flags(cpuinfo: Path = CPUINFO) -> frozenset[str]:
    """The first processor's flags (every core of a node has the same); none where unreadable."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):  # x86, ARM
            return frozenset(value.split())
    return frozenset()


def node_has_native_bf16(cpuinfo: Path = CPUINFO, machine: str | None = None) -> bool:
    return has_native_bf16(machine or platform.machine(), cpu_flags(cpuinfo))
