"""The installed llama.cpp is built for a portable instruction set, not for the build machine.

A native build on a CPU with AMX compiles ggml's AMX kernels, which segfault there, and a wheel
built on an AVX-512 machine would crash with SIGILL on one without. The Makefile builds with
GGML_NATIVE=OFF (x86-64-v3) and AVX-512 and AMX off; this disassembles what is installed and
counts instructions that need more than that.
"""

from __future__ import annotations

import platform
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from deployments.fallback.replica import llama_server_binary

# AVX-512 uses the zmm registers, and its mask registers k1-k7 (also on ymm/xmm, under
# AVX-512VL); AMX has its own tile instructions.
BEYOND_X86_64_V3 = re.compile(
    r"%zmm\d|%k[1-7]\b|\b(tdpb\w+|tileloadd\w*|ldtilecfg|tilezero|tilestored)\b"
)


def _libraries() -> list[Path]:
    """The wheel's libraries, and the `llama-server` binary make install builds (static: its
    ggml is compiled in)."""
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is part of the cpu extra")
    lib = Path(llama_cpp.__file__).parent / "lib"
    found = sorted(p for p in lib.glob("lib*.so*") if p.is_file() and not p.is_symlink())
    server = llama_server_binary()
    if server is None:
        pytest.fail("no llama-server beside this Python: run `make install` (make test does it)")
    return [*found, Path(server)]


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the instruction sets checked are x86's")
def test_no_installed_llama_cpp_library_uses_avx512_or_amx() -> None:
    objdump = shutil.which("objdump")
    if objdump is None:
        pytest.fail("objdump (binutils) is needed to check the llama.cpp build")
    libraries = _libraries()
    assert any("ggml-cpu" in p.name for p in libraries), f"no ggml CPU backend in {libraries}"
    for library in libraries:
        listing = subprocess.run(
            [objdump, "-d", "--no-show-raw-insn", str(library)],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        found = sorted({m.group(0) for m in BEYOND_X86_64_V3.finditer(listing)})
        assert not found, f"{library.name} uses {found[:5]}: rebuild with `make clean install`"


def test_the_pattern_finds_what_it_looks_for() -> None:
    sample = (
        "vpaddd %zmm1,%zmm2,%zmm3\n tdpbssd %tmm0,%tmm1,%tmm2\n vpaddd %ymm1,%ymm2,%ymm3\n"
        " vpaddd %ymm1,%ymm2,%ymm3{%k2}\n kmovw %k1,%eax"
    )
    assert {m.group(0) for m in BEYOND_X86_64_V3.finditer(sample)} == {
        "%zmm1",
        "%zmm2",
        "%zmm3",
        "tdpbssd",
        "%k2",
        "%k1",
    }
