"""The demo vision model: SmolVLM's architecture (Idefics3) around the demo language model.

Nothing can be downloaded from a model hub here, and no package ships a vision-language model, so
`python -m cluster.models prepare` builds one from what it has: SmolLM2-135M-Instruct (the
language model of SmolVLM-256M) as the language model, its vocabulary grown by Idefics3's image
tokens, and a small generated vision tower (a SigLIP encoder) and connector, seeded, so every
machine builds the same weights. The processor is transformers' own (Idefics3Processor with the
PIL image processor: no torchvision), the chat template is ours (ChatML with tools and images).

Its answers do not describe a picture; they depend on it. The connector's weights are a seeded
mix of real token embeddings scaled to their norm, so an image reads to the language model like a
blend of words, not like noise an order of magnitude louder than any word, and greedy answers
come out as text that changes with the image.

llama.cpp's converter (the `convert_hf_to_gguf.py` tree of the pinned llama.cpp source) then
writes the language model as a Q8_0 GGUF and the vision tower as an `--mmproj` file, which
llama.cpp's `llama-server --mmproj` reads (tests/integration/test_vision_model.py). The CPU
fallback does not use them yet: it reads no images (docs/how-it-works.md).
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

VISION_NAME = "SmolLM2-135M-Vision"
VISION_GGUF = f"{VISION_NAME}.Q8_0.gguf"
VISION_MMPROJ = f"{VISION_NAME}.mmproj-F16.gguf"
# Idefics3Processor's tokens: it looks these up in the tokenizer and adds only the first three.
IMAGE_TOKENS = (
    "<fake_token_around_image>",
    "<image>",
    "<end_of_utterance>",
    "<global-img>",
    *(f"<row_{row}_col_{col}>" for row in range(1, 7) for col in range(1, 7)),
)
CHAT_TEMPLATE = Path(__file__).parents[1] / "ray_configs" / "templates" / "chatml_tools.jinja"


@dataclass(frozen=True)
class VisionShape:
    """The generated tower. Small, so an image costs the CPU engines little beyond its tokens."""

    hidden_size: int = 128
    intermediate_size: int = 512
    layers: int = 2
    heads: int = 2  # head_dim 64
    tile: int = 256  # the encoder's input side, in pixels
    patch: int = 16
    scale_factor: int = 2  # Idefics3's pixel shuffle: 4 patches a token
    # Images are resized to fit this edge and cut into tiles of `tile`, plus the whole image
    # as one more tile: up to 2 x 2 + 1 tiles.
    longest_edge: int = 512
    seed: int = 0

    @property
    def tokens_per_tile(self) -> int:
        return (self.tile // self.patch) ** 2 // self.scale_factor**2


def build(demo: Path, out: Path, shape: VisionShape = VisionShape()) -> None:
    """Write the Hugging Face folder of the vision model into `out` from the demo model `demo`."""
    import torch
    from transformers import (
        AutoModelForCausalLM,
        AutoTokenizer,
        Idefics3Config,
        Idefics3ForConditionalGeneration,
        Idefics3Processor,
    )
    from transformers.models.idefics3.image_processing_pil_idefics3 import (
        Idefics3ImageProcessorPil,
    )

    torch.manual_seed(shape.seed)
    tokenizer = AutoTokenizer.from_pretrained(demo)
    tokenizer.add_special_tokens({"additional_special_tokens": list(IMAGE_TOKENS)})
    language = AutoModelForCausalLM.from_pretrained(demo, dtype=torch.float32)
    words = language.config.vocab_size
    vocab = math.ceil(len(tokenizer) / 64) * 64  # room for the image tokens, in whole rows of 64
    text_config = language.config.to_dict() | {"vocab_size": vocab}
    vision_config = {
        "hidden_size": shape.hidden_size,
        "intermediate_size": shape.intermediate_size,
        "num_hidden_layers": shape.layers,
        "num_attention_heads": shape.heads,
        "image_size": shape.tile,
        "patch_size": shape.patch,
    }
    config = Idefics3Config(
        vision_config=vision_config,
        text_config=text_config,
        scale_factor=shape.scale_factor,
        image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
        tie_word_embeddings=True,
        pad_token_id=language.config.pad_token_id,
    )
    model = Idefics3ForConditionalGeneration(config)
    state = {
        name.removeprefix("model."): weight
        for name, weight in language.state_dict().items()
        if name.startswith("model.")
    }
    embeddings = state["embed_tokens.weight"]
    grown = embeddings.new_empty(vocab, embeddings.shape[1])
    grown[:words] = embeddings
    grown[words:] = embeddings.mean(0)  # new tokens start as the average word
    state["embed_tokens.weight"] = grown
    model.model.text_model.load_state_dict(state, strict=True)
    model.tie_weights()
    generator = torch.Generator().manual_seed(shape.seed)
    projection = model.model.connector.modality_projection.proj.weight  # [text, vision * s^2]
    chosen = torch.randperm(words, generator=generator)[: projection.shape[1]]
    with torch.no_grad():
        # Each image feature (unit variance after the tower's norm) weighs one real word's
        # embedding; 1/sqrt(inputs) keeps the sum at a word's norm.
        projection.copy_(embeddings[chosen].T / math.sqrt(projection.shape[1]))
    # In bfloat16, as the engines serve it: vLLM warns of every weight it narrows on load (175
    # lines at each start in float32), and widens one to float32 silently where a CPU has no
    # bfloat16 math (models[].cpu_dtype: auto).
    model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    images = Idefics3ImageProcessorPil(
        size={"longest_edge": shape.longest_edge}, max_image_size={"longest_edge": shape.tile}
    )
    processor = Idefics3Processor(
        image_processor=images,
        tokenizer=tokenizer,
        image_seq_len=shape.tokens_per_tile,
        chat_template=CHAT_TEMPLATE.read_text(),
    )
    processor.save_pretrained(out)  # the tokenizer with it, and the template once


def convert(folder: Path, llama_convert: Path, text_out: Path, mmproj_out: Path) -> None:
    """The GGUFs of `folder` for llama.cpp: its language model (Q8_0) and its projector (F16),
    with the converter of the pinned llama.cpp source (`llama_convert` holds its
    convert_hf_to_gguf.py, conversion/ and gguf-py/)."""
    script = llama_convert / "convert_hf_to_gguf.py"
    if not script.is_file():
        raise FileNotFoundError(f"{script} is missing: `make model` unpacks llama.cpp's converter")
    # The converter's own gguf-py, not whatever gguf is installed: it writes that version's keys.
    env = os.environ | {"PYTHONPATH": str(llama_convert / "gguf-py")}
    for extra, out, kind in (([], text_out, "q8_0"), (["--mmproj"], mmproj_out, "f16")):
        command = [sys.executable, str(script), str(folder), *extra]
        command += ["--outtype", kind, "--outfile", str(out)]
        # Its log goes to stderr, a line a tensor: kept for the error only.
        subprocess.run(command, check=True, env=env, capture_output=True, text=True)
