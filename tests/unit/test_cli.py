"""`gps`, the one command line: each subcommand is its module's own CLI."""

from __future__ import annotations

import hashlib
import io
from importlib import metadata
from pathlib import Path

import pytest

from cluster import cli


def test_version_names_the_installed_package(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"gps {metadata.version('gpu-pool-serve')}"


def test_keys_hash_is_the_keys_cli(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("a-key\n"))
    assert cli.main(["keys", "hash"]) == 0
    assert capsys.readouterr().out.strip() == hashlib.sha256(b"a-key").hexdigest()


def test_check_refuses_a_broken_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("pools: []\n")
    assert cli.main(["check", str(broken)]) == 2
    assert "pools" in capsys.readouterr().err


def test_reload_refuses_a_broken_file_before_it_looks_for_the_app(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("pools: []\n")
    assert cli.main(["reload", str(broken), "--app", "none"]) == 2
    assert "gpu-pool-serve: reload refused:" in capsys.readouterr().err


def test_unknown_commands_and_no_command_say_how_to_use_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["serve"]) == 2
    assert "unknown command 'serve'" in capsys.readouterr().err
    assert cli.main([]) == 2
    assert "gps run [CONFIG]" in capsys.readouterr().out
    assert cli.main(["--help"]) == 0


def test_run_takes_one_config_at_most(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["run", "a.yaml", "b.yaml"]) == 2
    assert "usage: gps run" in capsys.readouterr().err


def test_the_console_script_is_declared() -> None:
    text = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    assert 'gps = "cluster.cli:main"' in text
