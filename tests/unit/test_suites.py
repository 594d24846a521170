"""`make test`'s runner names every failed test under its table (tests/suites.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.local_ray import haproxy_ports_of_node
from tests.suites import SUITES, failed_tests, haproxy_ports

SESSION = """
import pytest

def test_passes():
    pass

def test_fails():
    assert 1 == 2, "one is not two\\nand more"

def test_fails_at_length():
    assert not "x", "\\n".join(f"line {n}" for n in range(20))

@pytest.fixture
def broken():
    raise RuntimeError("setup broke")

def test_errs(broken):
    pass
"""


def test_each_failed_or_erred_test_is_named_with_its_errors_first_lines(tmp_path: Path) -> None:
    (tmp_path / "test_sample.py").write_text(SESSION)
    report = tmp_path / "report.xml"
    subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path),
         f"--junitxml={report}"],
        cwd=tmp_path, capture_output=True, check=False,
    )  # fmt: skip
    assert failed_tests(report) == (
        "test_sample::test_fails - AssertionError: one is not two",
        "    and more",
        "    assert 1 == 2",
        "test_sample::test_fails_at_length - AssertionError: line 0",
        *(f"    line {n}" for n in range(1, 13)),
        "    ... 8 more lines",
        'test_sample::test_errs - failed on setup with "RuntimeError: setup broke"',
    )


GROUP_SESSION = """
import gc
import warnings

class Dropped:
    def __del__(self):
        warnings.warn("subprocess 4321 is still running", ResourceWarning)

class Broken:
    def __del__(self):
        raise ValueError("closed twice")

def test_leaves_unraisables():
    for kind in (Dropped, Dropped, Broken):
        held = kind()
        held.me = held  # a cycle: only the collector drops it, inside the test
        del held
    gc.collect()
"""


def test_an_exception_groups_members_are_named_each_once_with_how_often(tmp_path: Path) -> None:
    # CI's log of the batch suite showed only "multiple unraisable exception warnings (4
    # sub-exceptions)": what each was is what mends it.
    (tmp_path / "test_group.py").write_text(GROUP_SESSION)
    report = tmp_path / "report.xml"
    subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "error",
         str(tmp_path), f"--junitxml={report}"],
        cwd=tmp_path, capture_output=True, check=False,
    )  # fmt: skip
    named = failed_tests(report)
    assert named[0].startswith("test_group::test_leaves_unraisables - ExceptionGroup: ")
    assert sorted(named[1:]) == [
        "    ResourceWarning: subprocess 4321 is still running (in Dropped.__del__) (x2)",
        "    ValueError: closed twice (in Broken.__del__)",
    ]


def test_a_session_that_wrote_no_report_names_nothing(tmp_path: Path) -> None:
    assert failed_tests(tmp_path / "missing.xml") == ()


def test_each_session_gets_haproxy_ports_of_its_own_from_a_runs_own_bases(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("RAY_SERVE_HAPROXY_METRICS_PORT", raising=False)
    monkeypatch.delenv("RAY_SERVE_HAPROXY_STATS_PORT", raising=False)
    ports = [tuple(haproxy_ports(name).values()) for name in SUITES]
    every = [port for pair in ports for port in pair]
    assert len(set(every)) == len(every) == 2 * len(SUITES)
    monkeypatch.setenv("RAY_SERVE_HAPROXY_STATS_PORT", "28404")
    stats = [haproxy_ports(name)["RAY_SERVE_HAPROXY_STATS_PORT"] for name in SUITES]
    assert stats[0] == "28404"
    assert len(set(stats)) == len(SUITES)


def test_the_nodes_of_one_sessions_cluster_get_haproxy_ports_of_their_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("RAY_SERVE_HAPROXY_METRICS_PORT", raising=False)
    monkeypatch.delenv("RAY_SERVE_HAPROXY_STATS_PORT", raising=False)
    sessions = {name: haproxy_ports(name) for name in SUITES}
    for variable, port in sessions["gcs"].items():  # as tests/suites.py starts its session
        monkeypatch.setenv(variable, port)
    nodes = [tuple(haproxy_ports_of_node(index).values()) for index in range(3)]
    assert nodes[0] == tuple(sessions["gcs"].values())  # the head keeps the session's
    every = [port for pair in nodes for port in pair]
    assert len(set(every)) == len(every)
    others = {port for name, ports in sessions.items() if name != "gcs" for port in ports.values()}
    assert not others & set(every)
    with pytest.raises(ValueError, match="room for 10"):
        haproxy_ports_of_node(10)
