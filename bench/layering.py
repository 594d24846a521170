"""How the code is laid out: the largest module, function lengths, imports against the layers.

`python -m bench.layering` prints the figures issue 14 asks for. Layers (docs/design.md, layers
and the import rule), inner to outer: core (vocabulary, config, topology, wire, errors), policy
(pure decisions), deployments and autoscale (adapters), cluster and bench (composition root and
tools). An import runs against the layering when an inner package imports an outer one, or a
pure package (core, policy) imports Ray, Serve or an HTTP framework, or when a module of the
gateway's processes (everything under core, policy, autoscale and deployments except
deployments/engine) imports the engine: vLLM, torch, or the ray.llm modules that load them.
"""

from __future__ import annotations

import ast
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RANKS = {"core": 1, "policy": 2, "deployments": 3, "autoscale": 3, "cluster": 4, "bench": 4}
PURE = {"core", "policy"}
FRAMEWORKS = {"ray", "fastapi", "starlette", "uvicorn", "httpx", "vllm", "grpc", "llama_cpp"}
# Modules that load vLLM or torch. ray.llm's routing policies and the rest of ray.llm's
# internals that import neither are allowed (deployments/router/adapters/replica_choice.py).
ENGINE_MODULES = (
    "vllm",
    "torch",
    "ray.serve.llm",
    "ray.llm._internal.serve.core.configs",
    "ray.llm._internal.serve.core.ingress",
    "ray.llm._internal.serve.engines",
)
ENGINE_HOME = "deployments.engine"  # the one package of the gateway that may load the engine


def modules() -> list[Path]:
    return sorted(p for top in RANKS for p in (ROOT / top).rglob("*.py") if p.is_file())


def imported(tree: ast.AST, module: str) -> list[str]:
    """Every module a file imports, relative imports resolved against its package."""
    package = module.rsplit(".", 1)[0]
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            names.append(base)
    return names


def loads_the_engine(module: str, target: str) -> bool:
    """A module of the gateway's processes importing vLLM, torch or what loads them."""
    if module.split(".")[0] not in PURE | {"deployments", "autoscale"}:
        return False
    if module == ENGINE_HOME or module.startswith(ENGINE_HOME + "."):
        return False
    return any(target == m or target.startswith(m + ".") for m in ENGINE_MODULES)


def against_layering(module: str, target: str) -> bool:
    top, target_top = module.split(".")[0], target.split(".")[0]
    if top in PURE and target_top in FRAMEWORKS:
        return True
    if loads_the_engine(module, target):
        return True
    return target_top in RANKS and RANKS[target_top] > RANKS[top]


def main() -> None:
    sizes: dict[str, int] = {}
    lengths: list[int] = []
    wrong: list[str] = []
    for path in modules():
        relative = path.relative_to(ROOT)
        module = ".".join(relative.with_suffix("").parts)
        text = path.read_text()
        sizes[str(relative)] = len(text.splitlines())
        tree = ast.parse(text)
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lengths.append((node.end_lineno or node.lineno) - node.lineno + 1)
        wrong.extend(
            f"{module} -> {t}" for t in imported(tree, module) if against_layering(module, t)
        )
    largest = max(sizes, key=sizes.__getitem__)
    deciles = statistics.quantiles(lengths, n=10)
    print(f"modules: {len(sizes)}, lines: {sum(sizes.values())}")
    print(f"largest module: {largest} ({sizes[largest]} lines)")
    print(f"modules over 400 lines: {sum(n > 400 for n in sizes.values())}")
    median = statistics.median(lengths)
    print(f"functions: {len(lengths)}, lines median {median:.0f}, p90 {deciles[-1]:.0f}")
    print(f"imports against the layering: {len(wrong)}")
    for line in sorted(set(wrong)) if "-v" in sys.argv else []:
        print(f"  {line}")


if __name__ == "__main__":
    main()
