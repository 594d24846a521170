"""The gateway's counters load a model's tokenizer without torch (policy/context/tokenizer_files.py)
and count exactly as transformers' AutoTokenizer does (what vLLM and our tests count with): the
same ids for text and special tokens, the same rendered prompts with and without tools, the same
vocabulary, from a model folder and from the CPU fallback's GGUF."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from policy.context.gguf_metadata import read_metadata
from policy.context.tokenizer_files import load_tokenizer

ROOT = Path(__file__).resolve().parents[2]
FOLDER = ROOT / ".models" / "SmolLM2-135M-Instruct"
GGUF = ROOT / ".models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
TEMPLATE = (ROOT / "ray_configs" / "templates" / "chatml_tools.jinja").read_text()
TEXTS = [
    "Hello, world!",
    "  leading spaces and\ttabs\nand lines",
    "naïve café — 東京 🚀",
    "<|im_start|>user\nspecial tokens inline<|im_end|>",
    "def f(x):\n    return x ** 2  # code",
    "",
]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "weather",
            "description": "The weather in a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
CHATS: list[list[dict[str, Any]]] = [
    [{"role": "user", "content": "hi"}],
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "And 3+3? ünïcödé"},
    ],
]


def auto(source: Path) -> Any:
    if source.suffix == ".gguf":
        return AutoTokenizer.from_pretrained(str(source.parent), gguf_file=source.name)
    return AutoTokenizer.from_pretrained(str(source))


def ids(encoded: Any) -> list[int]:
    return list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)


@pytest.mark.parametrize("source", [FOLDER, GGUF], ids=["folder", "gguf"])
def test_the_light_load_counts_as_autotokenizer(source: Path) -> None:
    light, full = load_tokenizer(source), auto(source)
    for text in TEXTS:
        assert light.encode(text, add_special_tokens=False) == full.encode(
            text, add_special_tokens=False
        )
        assert light.encode(text, add_special_tokens=True) == full.encode(
            text, add_special_tokens=True
        )
    assert light.get_vocab() == full.get_vocab()
    assert (light.bos_token, light.eos_token) == (full.bos_token, full.eos_token)
    for chat in CHATS:
        for template in (None, TEMPLATE):
            for tools in (None, TOOLS):
                if tools and template is None:
                    continue  # SmolLM2's own template has no tools
                kwargs = {"chat_template": template, "tools": tools, "tokenize": True}
                assert ids(
                    light.apply_chat_template(chat, add_generation_prompt=True, **kwargs)
                ) == (ids(full.apply_chat_template(chat, add_generation_prompt=True, **kwargs)))
    sample = full.encode(TEXTS[2], add_special_tokens=False)
    assert light.decode(sample) == full.decode(sample)


def test_the_light_load_imports_no_torch() -> None:
    probe = (
        "import sys\n"
        "from policy.context.tokens import ChatTemplateCounter\n"
        f"for source in ({str(FOLDER)!r}, {str(GGUF)!r}):\n"
        "    ChatTemplateCounter.from_pretrained(source).count_prompt("
        "[{'role': 'user', 'content': 'hi'}])\n"
        "print(sorted(m for m in ('torch', 'vllm') if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_the_gguf_metadata_is_what_ggufs_own_reader_reads() -> None:
    from gguf import GGUFReader

    ours = read_metadata(GGUF)
    theirs = {key: field.contents() for key, field in GGUFReader(str(GGUF)).fields.items()}
    assert ours.keys() == {k for k in theirs if not k.startswith("GGUF.")}  # the header's own
    for key in ours:
        assert (
            ours[key] == pytest.approx(theirs[key])
            if isinstance(ours[key], float)
            else (ours[key] == theirs[key])
        ), key


def test_a_file_that_is_not_gguf_is_refused(tmp_path: Path) -> None:
    fake = tmp_path / "model.gguf"
    fake.write_bytes(b"not a gguf file at all" * 4)
    with pytest.raises(ValueError, match="not a GGUF"):
        read_metadata(fake)


def test_what_loading_the_tokenizers_left_free_goes_back_to_the_system() -> None:
    # deployments/light_process.py: the router's replica trims its heap once they are loaded.
    probe = (
        "import os\n"
        "from deployments.light_process import release_freed_memory\n"
        "from policy.context.tokens import ChatTemplateCounter\n"
        "def rss():\n"
        "    status = open(f'/proc/{os.getpid()}/status').read().split('VmRSS:')[1]\n"
        "    return int(status.split()[0]) // 1024\n"
        f"for source in ({str(FOLDER)!r}, {str(GGUF)!r}):\n"
        "    ChatTemplateCounter.from_pretrained(source)\n"
        "before = rss()\n"
        "assert release_freed_memory()\n"
        "print(before, rss())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True
    )
    before, after = map(int, done.stdout.strip().splitlines()[-1].split())
    assert before - after >= 8, (before, after)  # MiB: 20-30 measured
