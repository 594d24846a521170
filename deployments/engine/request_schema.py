"""Write vLLM's own JSON Schema of each request kind into policy/request/engine_schema/, where
the gateway's edge checks bodies against it without importing vLLM (which imports torch).

    python -m deployments.engine.request_schema

Run it after a vLLM upgrade; tests/unit/test_engine_schema.py fails until the files are equal
to what the pinned vLLM says. A chat's `messages` and `tools` are left to the gateway's own rules
(policy/request/schema.py, messages.py): by schema they cost 25 times the rest of the body.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ray.llm._internal.serve.core.configs.openai_api_models import (
    ChatCompletionRequest,
    CompletionRequest,
    EmbeddingCompletionRequest,
)

from policy.request.engine_schema import LEFT_TO_OUR_RULES, SCHEMA_DIR

__all__ = ["engine_schemas", "main"]

KINDS: dict[str, Any] = {
    "chat": ChatCompletionRequest,
    "completion": CompletionRequest,
    "embedding": EmbeddingCompletionRequest,
}


def engine_schemas() -> dict[str, dict[str, Any]]:
    """Each kind's schema as the edge applies it (vLLM's, less the fields left to our rules)."""
    schemas = {}
    for kind, model in KINDS.items():
        schema = model.model_json_schema()
        for name in LEFT_TO_OUR_RULES.get(kind, ()):
            schema["properties"].pop(name, None)
            schema["required"] = [r for r in schema.get("required", []) if r != name]
        schemas[kind] = schema
    return schemas


def schema_text(schema: dict[str, Any]) -> str:
    return json.dumps(schema, indent=1, sort_keys=True) + "\n"


def main() -> None:
    for kind, schema in engine_schemas().items():
        path = Path(SCHEMA_DIR) / f"{kind}.json"
        path.write_text(schema_text(schema))
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
