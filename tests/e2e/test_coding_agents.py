"""Codex CLI and Claude Code, installed from npm unchanged (tests/e2e/coding_agents.py), against
the shared app with docs/api.md's settings: Codex over the Responses API, Claude Code over the
Messages API, each with its whole default request (tools and all, fitted by the gateway).

Both exit 0 on a useless answer, so each run is judged by its JSON: a final answer, and in the
tool round trips a tool the client really ran whose result went back. A 135M model does not call
tools on cue, so the round trips run on a test engine scripted to (thinker@local,
tests/fakes/scripted_reply.py: the prompt says which call to make, the answer quotes the tool's
result). The file's secret reaches the final answer only through the client's own tool run. The
demo model's runs on real vLLM must end with an answer. Claude Code's there runs without tools
and with a short system prompt (`--tools ""`, `--system-prompt`): its default request fitted into
the e2e model's 4,096 tokens leaves about 50 tokens for the answer, and with even one tool listed
the 135M model ran on to its whole output budget (2,457 tokens, minutes here); Claude Code calls
an answer stopped at max_tokens an error after three continuations (docs/api.md says what window
it needs)."""

from __future__ import annotations

import json
import re
import secrets
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import API_KEY
from tests.e2e.coding_agents import (
    NoNpm,
    codex_config,
    codex_events,
    codex_items,
    installed_agents,
    run_agent,
)
from tests.fakes.scripted_reply import QUOTE

SCRIPTED = "thinker"  # a test engine (tests/e2e/gateway.yaml), window 8192
SCRIPTED_BACKEND = "thinker@local"
REAL = "coding"  # the demo model on vLLM, window 4096
WINDOWS = {SCRIPTED: 8192, REAL: 4096}


@pytest.fixture(scope="module")
def agents() -> Path:
    try:
        return installed_agents()
    except NoNpm as missing:
        pytest.skip(str(missing))


@pytest.fixture
def scratch(tmp_path: Path) -> Path:
    """The agent's working folder, with a file whose secret only a tool run can read."""
    folder = tmp_path / "work"
    folder.mkdir()
    return folder


def plant(scratch: Path) -> str:
    secret = f"gps-{secrets.token_hex(6)}"
    (scratch / "probe.txt").write_text(f"{secret}\n")
    return secret


def codex(
    agents: Path, gateway: str, scratch: Path, model: str, prompt: str
) -> list[dict[str, Any]]:
    home = scratch.parent / "codex-home"
    home.mkdir(exist_ok=True)
    (home / "config.toml").write_text(codex_config(gateway, model, WINDOWS[model]))
    run = run_agent(
        [str(agents / "codex"), "exec", "--json", "--skip-git-repo-check", prompt],
        scratch,
        {"CODEX_HOME": str(home), "GPS_KEY": API_KEY},
    )
    assert run.returncode == 0, run.explain()
    return codex_events(run.stdout)


def claude(
    agents: Path, gateway: str, scratch: Path, model: str, prompt: str, *options: str
) -> dict[str, Any]:
    env = {
        "ANTHROPIC_BASE_URL": gateway,
        "ANTHROPIC_API_KEY": API_KEY,
        "ANTHROPIC_MODEL": model,
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": model,  # its small jobs, if it sends any
        "CLAUDE_CODE_AUTO_COMPACT_WINDOW": str(WINDOWS[model]),
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
    }
    # Read only, and only here: nothing it runs can write or reach outside the folder.
    argv = [str(agents / "claude"), "-p", prompt, "--output-format", "json"]
    run = run_agent([*argv, "--allowedTools", "Read", *options], scratch, env)
    assert run.returncode == 0, run.explain()
    result: dict[str, Any] = json.loads(run.stdout.strip().splitlines()[-1])
    return result


def shortenings(http: httpx.Client, backend: str) -> float:
    pattern = (
        rf'^gps_context_tool_shortenings_total\{{backend="{re.escape(backend)}",step="2"\}} (\S+)$'
    )
    found = re.search(pattern, http.get("/metrics").text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def test_codex_runs_its_shell_tool_and_answers_with_what_it_read(
    agents: Path, gateway: str, scratch: Path
) -> None:
    secret = plant(scratch)
    call = json.dumps({"cmd": "cat probe.txt"})
    events = codex(agents, gateway, scratch, SCRIPTED, f"Read the probe.\nCALL exec_command {call}")
    ran = codex_items(events, "command_execution")
    assert ran, events
    assert any(secret in item.get("aggregated_output", "") for item in ran), ran
    answers = [item["text"] for item in codex_items(events, "agent_message")]
    assert answers, events
    assert answers[-1].startswith(QUOTE)
    assert secret in answers[-1]  # the command's output went back to the model


def test_claude_code_reads_a_file_with_its_tools_fitted_and_answers_with_it(
    agents: Path, gateway: str, scratch: Path, http: httpx.Client
) -> None:
    secret = plant(scratch)
    before = shortenings(http, SCRIPTED_BACKEND)
    call = json.dumps({"file_path": str(scratch / "probe.txt")})
    result = claude(agents, gateway, scratch, SCRIPTED, f"Read the probe.\nCALL Read {call}")
    assert result.get("is_error") is False, result
    assert result.get("num_turns", 0) >= 2, result  # the call, then the answer to its result
    assert result["result"].startswith(QUOTE), result
    assert secret in result["result"]  # Read ran in the client and its result came back
    # Claude Code's default tools (~8,500 tokens here) were fitted: descriptions left out.
    assert shortenings(http, SCRIPTED_BACKEND) >= before + 2


def test_codex_ends_with_an_answer_from_the_demo_model(
    agents: Path, gateway: str, scratch: Path
) -> None:
    events = codex(agents, gateway, scratch, REAL, "Reply with one word: OK")
    answers = [item["text"] for item in codex_items(events, "agent_message")]
    assert answers, events
    assert answers[-1].strip(), events
    assert any(e.get("type") == "turn.completed" for e in events), events


def test_claude_code_ends_with_an_answer_from_the_demo_model(
    agents: Path, gateway: str, scratch: Path
) -> None:
    short = ("--tools", "", "--system-prompt", "You are a helpful assistant. Be brief.")
    result = claude(agents, gateway, scratch, REAL, "Reply with one word: OK", *short)
    assert result.get("is_error") is False, result
    assert str(result.get("result", "")).strip(), result
