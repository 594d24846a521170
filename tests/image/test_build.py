"""The CPU image is built from a base made of Debian packages (conftest.py) and holds a whole
install: its command is `make run`, its proxy listens beyond the container, and `make` finds
nothing left to build in it, so a container starts serving without compiling or downloading.
No Ray runs here: `make test` builds it beside the suites that stop every Ray process."""

from __future__ import annotations

import json

from tests.image.podman_cli import podman, run_flags

BUILD_CHECK_TIMEOUT_S = 300  # make reads the venv's and the model's files


def configured(image: str, field: str) -> object:
    return json.loads(
        podman("image", "inspect", "--format", f"{{{{json .Config.{field}}}}}", image)
    )


def test_the_cpu_image_holds_a_whole_install_and_serves_with_make_run(cpu_image: str) -> None:
    assert configured(cpu_image, "Cmd") == ["make", "run"]
    environment = configured(cpu_image, "Env")
    assert isinstance(environment, list)
    assert "RAY_SERVE_DEFAULT_HTTP_HOST=0.0.0.0" in environment
    # `make --question` exits 0 only when every target is up to date.
    podman(
        "run", "--rm", *run_flags(), cpu_image, "make", "--question", "install", "model",
        timeout_s=BUILD_CHECK_TIMEOUT_S,
    )  # fmt: skip
