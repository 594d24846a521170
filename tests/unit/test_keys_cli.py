"""`python -m cluster.keys`: a key's digest from stdin or a prompt, never from the command line."""

from __future__ import annotations

import hashlib
import io

import pytest

from cluster import keys


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def test_hash_reads_the_key_from_stdin(capsys: pytest.CaptureFixture[str]) -> None:
    assert keys.main(["hash"], stdin=io.StringIO("gps-secret\n")) == 0
    out = capsys.readouterr().out
    assert out.strip() == digest("gps-secret")
    assert "gps-secret" not in out


def test_hash_prompts_without_echo_at_a_terminal(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[str] = []

    def getpass(prompt: str) -> str:
        asked.append(prompt)
        return "typed-key"

    monkeypatch.setattr("getpass.getpass", getpass)
    assert keys.main(["hash"], stdin=Terminal()) == 0
    assert capsys.readouterr().out.strip() == digest("typed-key")
    assert len(asked) == 1
    assert "not echoed" in asked[0]


def test_an_empty_key_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert keys.main(["hash"], stdin=io.StringIO("")) == 2
    assert "no key given" in capsys.readouterr().err


def test_a_key_on_the_command_line_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        keys.main(["hash", "gps-secret"], stdin=io.StringIO("other\n"))
    assert exited.value.code == 2
    assert "unrecognized arguments" in capsys.readouterr().err


def test_new_prints_a_fresh_key_and_its_digest(capsys: pytest.CaptureFixture[str]) -> None:
    assert keys.main(["new"]) == 0
    key, printed = capsys.readouterr().out.split()
    assert key.startswith("gps-")
    assert printed == digest(key)
