"""The fingerprint a restarted placement actor finds its placements by: the same for the same
config in any process, different for a different config."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = """
import sys
from core.config import load_config
from autoscale.saved import config_fingerprint
config = load_config("ray_configs/local.yaml", environ={})
if sys.argv[1] == "changed":
    config = config.model_copy(update={"placement": config.placement.model_copy(
        update={"cooldown_s": config.placement.cooldown_s + 1})})
print(config_fingerprint(config))
"""


def fingerprint(hash_seed: str, variant: str = "same") -> str:
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, variant],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip().splitlines()[-1]


def test_the_same_config_has_the_same_fingerprint_in_any_process() -> None:
    assert fingerprint("1") == fingerprint("2")


def test_a_changed_config_has_another_fingerprint() -> None:
    assert fingerprint("1") != fingerprint("1", "changed")
