"""The coding agents as a user installs them: from npm, unchanged, at pinned versions, into
`.agents/` (kept between runs: Claude Code's platform binary alone is ~230 MB), each run in a
scratch folder with a home of its own, so neither reads this machine's settings or writes
outside it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).parents[2]
PINNED = {"@openai/codex": "0.169.0", "@anthropic-ai/claude-code": "2.1.328"}
INSTALL_TIMEOUT_S = 900
RUN_TIMEOUT_S = 900  # a real CPU engine's prefill of a whole agent request, on a busy machine


class NoNpm(RuntimeError):
    """This machine has no npm: the agents cannot be installed."""


def installed_agents(cache: Path = ROOT / ".agents") -> Path:
    """The folder of the agents' executables, installed there unless the pinned versions are."""
    npm = shutil.which("npm")
    if npm is None:
        raise NoNpm("npm is not on this machine's PATH: Node 20+ with npm runs the coding agents")
    manifest = {"private": True, "dependencies": PINNED}
    stamp = cache / "package.json"
    bin_dir = cache / "node_modules" / ".bin"
    ready = all((bin_dir / name).exists() for name in ("codex", "claude"))
    if ready and stamp.exists() and json.loads(stamp.read_text()) == manifest:
        return bin_dir
    cache.mkdir(parents=True, exist_ok=True)
    stamp.write_text(json.dumps(manifest, indent=2))
    subprocess.run(
        [npm, "install", "--no-audit", "--no-fund", "--no-package-lock"],
        cwd=cache,
        check=True,
        timeout=INSTALL_TIMEOUT_S,
    )
    return bin_dir


@dataclass(frozen=True)
class Run:
    returncode: int
    stdout: str
    stderr: str

    def explain(self) -> str:
        out, err = self.stdout[-3000:], self.stderr[-3000:]
        return f"exit {self.returncode}\nstdout:\n{out}\nstderr:\n{err}"


def run_agent(argv: list[str], scratch: Path, env: dict[str, str]) -> Run:
    """`argv` in `scratch`, with a home of its own there and only `env` beyond PATH."""
    home = scratch / ".home"
    home.mkdir(exist_ok=True)
    base = {"PATH": os.environ.get("PATH", ""), "HOME": str(home), "LANG": "C.UTF-8"}
    done = subprocess.run(
        argv,
        cwd=scratch,
        env={**base, **env},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )
    return Run(done.returncode, done.stdout, done.stderr)


def codex_config(base_url: str, model: str, window: int) -> str:
    """docs/api.md's Codex settings for this gateway."""
    return (
        f'model = "{model}"\n'
        'model_provider = "gps"\n'
        f"model_context_window = {window}\n"
        "[model_providers.gps]\n"
        'name = "gpu-pool-serve"\n'
        f'base_url = "{base_url}/v1"\n'
        'wire_api = "responses"\n'
        'env_key = "GPS_KEY"\n'
    )


def codex_events(stdout: str) -> list[dict[str, Any]]:
    """`codex exec --json`'s events (one JSON object a line)."""
    events = []
    for line in stdout.splitlines():
        line = line.strip()
        if line.startswith("{"):
            events.append(json.loads(line))
    return events


def codex_items(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [
        e["item"]
        for e in events
        if e.get("type") == "item.completed" and e.get("item", {}).get("type") == kind
    ]
