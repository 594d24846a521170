"""The profile summary bench/pace.py prints: py-spy's collapsed stacks summed per function."""

from __future__ import annotations

from pathlib import Path

from bench.profile import top


def test_functions_are_summed_over_stacks_and_lines_on_the_stack_and_running(
    tmp_path: Path,
) -> None:
    raw = tmp_path / "raw.txt"
    site = "/venv/lib/python3.11/site-packages"
    raw.write_text(
        f"main (app.py:1);handle (app.py:10);record ({site}/ray/util/metrics.py:133) 6\n"
        "main (app.py:1);handle (app.py:12);parse (body.py:4) 3\n"
        "main (app.py:1) 1\n"
        "not a stack line\n"
    )
    samples, on_stack, running = top(raw, count=3)
    assert samples == 10
    shares = {e.function: (e.inclusive, e.self_share) for e in on_stack}
    assert shares["main (app.py)"] == (1.0, 0.1)
    # Two lines of one function are one function; a site-packages path is cut to the package.
    assert shares["handle (app.py)"] == (0.9, 0.0)
    assert shares["record (ray/util/metrics.py)"] == (0.6, 0.6)
    assert [e.function for e in running] == [
        "record (ray/util/metrics.py)",
        "parse (body.py)",
        "main (app.py)",
    ]
