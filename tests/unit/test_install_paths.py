"""Every way a node is built goes through one install script, deploy/install-node.sh.

ray_configs/cluster.yaml, both Terraform modules and both Dockerfiles call it instead of pip
lines of their own, and the script does what each needs: the project with the `gpu` extra into
the Python that runs `ray` and the engines' parent-death hook, or the CPU demo's `make install
model`, and Ollama on request. The script runs here against stand-ins (a Python, make, curl
that only write down how they were called): nothing is installed.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "deploy" / "install-node.sh"
CALLED = "deploy/install-node.sh"
DOCKERFILES = {kind: ROOT / "deploy" / "docker" / f"Dockerfile.{kind}" for kind in ("gpu", "cpu")}
TERRAFORM = [ROOT / "terraform" / name / "main.tf" for name in ("aws", "runpod")]
OLLAMA_INSTALLER = "https://ollama.com/install.sh"
# A stand-in that writes down its name, its folder and its arguments, one line a call.
RECORDER = '#!/bin/bash\necho "$(basename "$0")|$PWD|$*" >> "$CALLS"\n'


def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, its arguments) of a Dockerfile, continuation lines joined."""
    joined = dockerfile.read_text().replace("\\\n", " ")
    lines = [line.strip() for line in joined.splitlines()]
    found = []
    for line in lines:
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            found.append((word.upper(), " ".join(rest.split())))
    return found


def runs(dockerfile: Path) -> list[str]:
    return [arguments for word, arguments in instructions(dockerfile) if word == "RUN"]


def cluster_yaml() -> dict[str, list[str]]:
    loaded: dict[str, list[str]] = yaml.safe_load(
        (ROOT / "ray_configs" / "cluster.yaml").read_text()
    )
    return loaded


def test_the_ray_cluster_installs_each_node_with_the_script_alone() -> None:
    cluster = cluster_yaml()
    assert cluster["setup_commands"] == [f"bash ~/gpu-pool-serve/{CALLED} gpu"]
    # The head runs the CPU fallback, which the example config gives an Ollama model.
    assert cluster["head_setup_commands"] == [f"bash ~/gpu-pool-serve/{CALLED} ollama"]
    commands = [c for key in ("setup_commands", "head_setup_commands", "worker_setup_commands")
                for c in cluster.get(key, [])]  # fmt: skip
    assert not [c for c in commands if "pip" in c]


@pytest.mark.parametrize("module", TERRAFORM, ids=lambda path: path.parent.name)
def test_terraform_nodes_carry_the_script_and_install_with_it(module: Path) -> None:
    text = module.read_text()
    assert f'filebase64("${{path.module}}/../../{CALLED}")' in text
    assert "gps-install-node gpu --source '${var.project_source}'" in text
    assert "pip install" not in text


@pytest.mark.parametrize("kind", DOCKERFILES)
def test_each_dockerfile_installs_with_the_script_alone(kind: str) -> None:
    dockerfile = DOCKERFILES[kind]
    words = instructions(dockerfile)
    assert words[0][0] == "ARG"
    assert words[0][1].startswith("BASE=")
    assert ("FROM", "${BASE}") in words
    assert [r for r in runs(dockerfile) if f"bash {CALLED} {kind}" in r]
    assert not [r for r in runs(dockerfile) if "pip install" in r]


def test_the_gpu_image_starts_from_rays_llm_image_and_may_add_ollama() -> None:
    words = instructions(DOCKERFILES["gpu"])
    assert words[0] == ("ARG", "BASE=rayproject/ray-llm:2.60.0-py311-cu128")
    assert ("ARG", "INSTALL_OLLAMA=0") in words
    [install] = runs(DOCKERFILES["gpu"])
    assert install.startswith("GPS_INSTALL_OLLAMA=${INSTALL_OLLAMA} ")


def test_the_cpu_image_serves_the_demo_with_make_run_on_every_interface() -> None:
    words = instructions(DOCKERFILES["cpu"])
    assert words[0] == ("ARG", "BASE=debian:bookworm-slim")
    assert ("ENV", "RAY_SERVE_DEFAULT_HTTP_HOST=0.0.0.0") in words
    assert ("EXPOSE", "8000") in words
    [command] = [arguments for word, arguments in words if word == "CMD"]
    assert json.loads(command) == ["make", "run"]


def test_the_build_context_leaves_out_what_a_checkout_grows() -> None:
    ignored = (ROOT / ".dockerignore").read_text().splitlines()
    assert {".git", ".venv", ".models"} <= set(ignored)


@pytest.fixture
def stand_ins(tmp_path: Path) -> Path:
    """A folder of recording stand-ins: python-stub, python3 (caught if the script falls back
    to it), make, systemctl (no unit enabled) and curl (serves an "installer" that records)."""
    folder = tmp_path / "bin"
    folder.mkdir()
    for name in ("python-stub", "python3", "make", "ollama-installer"):
        (folder / name).write_text(RECORDER)
    (folder / "systemctl").write_text(RECORDER + "exit 1\n")
    (folder / "curl").write_text(RECORDER + f'echo "{folder}/ollama-installer"\n')
    for stand_in in folder.iterdir():
        stand_in.chmod(0o755)
    return folder


def install(stand_ins: Path, *args: str, **env: str) -> list[str]:
    """The script run with only the stand-ins and the system's basic tools on PATH; the
    calls they recorded, as `name|folder|arguments`."""
    calls = stand_ins.parent / "calls"
    calls.touch()
    environment = {"PATH": f"{stand_ins}:/usr/bin:/bin", "CALLS": str(calls), **env}
    subprocess.run(["bash", str(SCRIPT), *args], env=environment, check=True, capture_output=True)
    return calls.read_text().splitlines()


def test_a_gpu_node_gets_the_checkout_with_the_gpu_extra_and_the_parent_death_hook(
    stand_ins: Path,
) -> None:
    python = str(stand_ins / "python-stub")
    assert install(stand_ins, "gpu", GPS_PYTHON=python) == [
        f"python-stub|{os.getcwd()}|-m pip install -e {ROOT}[gpu]",
        "python-stub|/|-m deployments.engine.parent_death install",
    ]


def test_a_node_without_a_checkout_installs_its_source_into_the_python_behind_ray(
    stand_ins: Path,
) -> None:
    (stand_ins / "ray").write_text(f"#!{stand_ins / 'python-stub'}\n")
    (stand_ins / "ray").chmod(0o755)
    calls = install(stand_ins, "gpu", "--source", "git+https://example.org/gps.git")
    assert [call.partition("|")[0] for call in calls] == ["python-stub"] * 2
    assert calls[0].endswith(
        "|-m pip install gpu-pool-serve[gpu] @ git+https://example.org/gps.git"
    )
    assert calls[1].endswith("|-m deployments.engine.parent_death install")


# What pip writes as a console script when the interpreter's path is long or has spaces.
TRAMPOLINE = "#!/bin/sh\n'''exec' \"/a long/path/python\" \"$0\" \"$@\"\n' '''\n"


def test_a_ray_whose_python_cannot_be_told_is_refused(stand_ins: Path) -> None:
    """Never a guess: the Python behind a trampoline is not read, and python3 may not be it."""
    (stand_ins / "ray").write_text(TRAMPOLINE)
    (stand_ins / "ray").chmod(0o755)
    with pytest.raises(subprocess.CalledProcessError) as refused:
        install(stand_ins, "gpu")
    assert b"set GPS_PYTHON" in refused.value.stderr
    assert not (stand_ins.parent / "calls").read_text()


def test_the_cpu_demo_is_the_projects_own_make_install(stand_ins: Path) -> None:
    assert install(stand_ins, "cpu") == [f"make|{os.getcwd()}|-C {ROOT} install model"]


def test_ollama_comes_from_its_official_installer_on_request(stand_ins: Path) -> None:
    calls = install(stand_ins, "gpu", GPS_PYTHON=str(stand_ins / "python-stub"),
                    GPS_INSTALL_OLLAMA="1")  # fmt: skip
    names = [call.partition("|")[0] for call in calls]
    assert names[2:] == ["curl", "ollama-installer", "systemctl"]
    assert calls[2].endswith(f"|-fsSL {OLLAMA_INSTALLER}")


def test_ollama_already_there_is_left_alone(stand_ins: Path) -> None:
    (stand_ins / "ollama").write_text(RECORDER)
    (stand_ins / "ollama").chmod(0o755)
    assert install(stand_ins, "ollama") == []


@pytest.mark.parametrize("args", [[], ["arm"], ["cpu", "--source", "x"], ["gpu", "--source"]])
def test_anything_else_is_refused_with_the_usage(stand_ins: Path, args: list[str]) -> None:
    calls = stand_ins.parent / "calls"
    environment = {"PATH": f"{stand_ins}:/usr/bin:/bin", "CALLS": str(calls)}
    ran = subprocess.run(["bash", str(SCRIPT), *args], env=environment, capture_output=True,
                         text=True, check=False)  # fmt: skip
    assert ran.returncode == 2
    assert ran.stderr.startswith("usage: install-node.sh gpu")
    assert not calls.exists()
