"""A model's tokenizer and chat template, loaded without torch.

transformers 5's `AutoTokenizer` imports its generation code, which imports torch: 15-20 s of CPU
and about 500 MB in every gateway process that only counts tokens. Its tokenizer classes do not:
a model folder's tokenizer is its `tokenizer_config.json`'s class (a `tokenizers`-backed class,
named from transformers' top level), and a GGUF's is built from its metadata
(policy/context/gguf_metadata.py) by transformers' own GGUF tokenizer converter, as
`AutoTokenizer` builds it. A source this cannot read (another backend, a name transformers does
not export) falls back to `AutoTokenizer`, logged: exact counts before a light process.
tests/integration/test_tokenizer_files.py holds the light load's counts equal to AutoTokenizer's.
"""

from __future__ import annotations

import functools
import json
import logging
from pathlib import Path
from typing import Any

from policy.context.gguf_metadata import read_metadata

__all__ = ["load_tokenizer"]

logger = logging.getLogger("ray.serve")

# transformers' GGUF special tokens: the config's name, and llama.cpp's key of its id.
_SPECIAL_TOKENS = {
    "bos_token": "bos_token_id",
    "eos_token": "eos_token_id",
    "unk_token": "unknown_token_id",
    "pad_token": "padding_token_id",
}


def load_tokenizer(source: str | Path) -> Any:
    """The tokenizer at `source` (a model folder, a hub id, or a `.gguf` file), loaded once per
    process: counters of one model with other chat templates (models[].tools) share it, and
    reading it does not change it."""
    return _loaded(str(source))


@functools.cache
def _loaded(source: str) -> Any:
    path = Path(source)
    try:
        return _from_gguf(path) if path.suffix == ".gguf" else _from_folder(str(source))
    except Exception as error:  # noqa: BLE001 - any shape the light load cannot read
        logger.warning("tokenizer %s: %s; loading it with AutoTokenizer (imports torch)", source,
                       error)  # fmt: skip
    from transformers import AutoTokenizer

    if path.suffix == ".gguf":
        return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    return AutoTokenizer.from_pretrained(str(source))


def _from_folder(source: str) -> Any:
    import transformers
    from transformers.tokenization_utils_tokenizers import TokenizersBackend
    from transformers.utils import cached_file

    config_file = cached_file(source, "tokenizer_config.json")
    config = json.loads(Path(config_file).read_text()) if config_file else {}
    name = config.get("tokenizer_class") or "TokenizersBackend"
    kind = getattr(transformers, name, None)
    if not (isinstance(kind, type) and issubclass(kind, TokenizersBackend)):
        raise ValueError(f"its tokenizer class {name!r} is not one backed by `tokenizers`")
    return kind.from_pretrained(source)  # type: ignore[attr-defined]


def _from_gguf(path: Path) -> Any:
    from transformers.integrations.gguf.gguf_tokenizer_mapping import (
        GGUF_TOKENIZER_MAPPING,
        convert_gguf_tokenizer,
    )
    from transformers.tokenization_utils_tokenizers import TokenizersBackend

    metadata = read_metadata(path)
    grouped = {
        group: {
            name: metadata[f"tokenizer.{key}"]
            for key, name in renames.items()
            if f"tokenizer.{key}" in metadata
        }
        for group, renames in GGUF_TOKENIZER_MAPPING.items()
    }
    tokenizer, config = grouped["tokenizer"], grouped["tokenizer_config"]
    for name, key in _SPECIAL_TOKENS.items():
        token_id = metadata.get(f"tokenizer.ggml.{key}")
        config[name] = tokenizer["tokens"][token_id] if token_id is not None else None
    backend, extra = convert_gguf_tokenizer(metadata["general.architecture"], tokenizer)
    return TokenizersBackend(tokenizer_object=backend, **config, **extra)
