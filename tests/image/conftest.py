"""The CPU image (deploy/docker/Dockerfile.cpu), built for real for tests/image with podman.

No container registry is reachable here, so its base is made of Debian packages: debootstrap's
minimal bookworm, imported into podman and passed as `--build-arg BASE`. The build borrows the
host's build caches, so that it costs minutes instead of a cold install's twenty: make install's
llama.cpp builds (seeded, see the Dockerfile), pip's cache, and the sources of this machine's pip
configuration (local indexes and wheels, its constraints, its CA bundle for the egress proxy).
They are mounted into the RUN steps only (`podman build -v`): of them only the llama.cpp builds
end up in the image (copied, as a cold build would have made them), and empty mount points (an
empty /etc/pip.conf, empty folders), which podman leaves. So the build from `debian:bookworm-slim`
with PyTorch's index and a cold llama.cpp compile (`make image`) is not what this tests. The
image is removed at the end; GPS_IMAGE_TEST_KEEP=1 leaves it for debugging.

`make test` builds it in its first phase (the `image-build` suite, test_build.py, beside
sessions that run no container: a `ray stop` there would end the container's Ray too, its
processes being visible from here) and runs it in its last (`image`): one image per run, named
for the run (MAKE_TEST_RUN, set by tests/suites.py), which the build suite keeps for the run's.
A suite that finds no such image builds it.
"""

from __future__ import annotations

import ast
import os
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.own_processes import SUITE_VARIABLE

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "deploy" / "docker" / "Dockerfile.cpu"
BASE_TAG = "localhost/gps-image-test-base:bookworm"
IMAGE_NAME = "localhost/gps-image-test"
RUN_VARIABLE = "MAKE_TEST_RUN"  # one id per `make test` run (tests/suites.py)
BUILD_SUITE = "image-build"  # keeps the image for the run's `image` suite
DEBIAN_MIRROR = "http://deb.debian.org/debian"  # plain HTTP: apt checks its own signatures
KEEP_VARIABLE = "GPS_IMAGE_TEST_KEEP"
DEBOOTSTRAP_TIMEOUT_S = 900  # about 35 s here
BUILD_TIMEOUT_S = 2400  # a few minutes with the caches, twenty and more without
# Seconds, usually; past 120 beside the last phase's suites (a clean-clone run of da648cb, its
# image suite's teardown), so an image's removal gets as long as its import.
REMOVE_TIMEOUT_S = 600
IMPORT_TIMEOUT_S = 300  # 200 MB from a local folder: seconds
# RUN steps without an OCI runtime: on this machine crun refuses cgroups v1 in hybrid mode and
# runc the rlimits it may not raise (no CAP_SYS_RESOURCE). One layer: the test keeps no cache.
BUILD_FLAGS = ("--isolation", "chroot", "--layers=false")
# Where the build finds what the host lends (Dockerfile.cpu names the seed's path).
LLAMA_SEED = "/var/cache/gps-seed"
PIP_CONF_IN_BUILD = "/etc/pip.conf"
CA_IN_BUILD = "/etc/gps-build-ca.crt"  # its own path: the image's ca-certificates owns the usual
# The pip settings that say where packages come from, carried from this machine's configuration.
PIP_SOURCES = ("index-url", "extra-index-url", "find-links", "constraint", "trusted-host")
PIP_PATHS = ("index-url", "extra-index-url", "find-links", "constraint")


def tail(log: Path, lines: int = 80) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


def run_logged(command: list[str], log: Path, timeout_s: float) -> None:
    """`command`, its output in `log`; the test fails with the log's end when it does."""
    with log.open("w") as out:
        try:
            status = subprocess.run(
                command, stdout=out, stderr=subprocess.STDOUT, timeout=timeout_s, check=False
            ).returncode
        except subprocess.TimeoutExpired:
            pytest.fail(f"{command[0]} {command[1]} ran past {timeout_s} s:\n{tail(log)}")
    if status != 0:
        pytest.fail(f"{command[0]} {command[1]} exited {status}:\n{tail(log)}")


def remove_image(tag: str) -> None:
    if os.environ.get(KEEP_VARIABLE) == "1":
        print(f"kept {tag} ({KEEP_VARIABLE}=1)")
        return
    subprocess.run(["podman", "rmi", "--force", tag], check=True, timeout=REMOVE_TIMEOUT_S)


def host_pip_settings() -> dict[str, str]:
    """PIP_SOURCES as pip reads them here (files and environment; the environment wins)."""
    listed = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    settings = {}
    for line in sorted(listed, key=lambda entry: entry.startswith(":env:")):
        name, _, value = line.partition("=")
        key = name.rpartition(".")[2]  # global.find-links, :env:.find-links
        if key in (*PIP_SOURCES, "cert"):
            settings[key] = str(ast.literal_eval(value))
    return settings


def local_paths(key: str, value: str) -> list[str]:
    """The folders and files on this machine that a pip setting names. For a local index, the
    folder around its root: its pages link to files beside it (../../files/x.whl)."""
    paths = [item.removeprefix("file://") for item in value.split()]
    if key in ("index-url", "extra-index-url"):
        paths = [str(Path(path).parent) for path in paths]
    return [path for path in paths if path.startswith("/") and Path(path).exists()]


def host_ca_bundle(settings: dict[str, str]) -> str | None:
    """The CA bundle pip trusts here: the egress proxy's CA is in it, not in the image's."""
    verify = ssl.get_default_verify_paths()
    for bundle in (settings.get("cert"), verify.cafile, verify.openssl_cafile):
        if bundle and Path(bundle).is_file():
            return bundle
    return None


def pip_conf(settings: dict[str, str], ca_bundle: str | None) -> str:
    lines = ["[global]", *(f"{key} = {settings[key]}" for key in PIP_SOURCES if key in settings)]
    if ca_bundle is not None:
        lines.append(f"cert = {CA_IN_BUILD}")
    return "\n".join(lines) + "\n"


def build_volumes(folder: Path) -> list[str]:
    """`podman build -v` arguments: what the host lends the RUN steps (build caches only)."""
    settings = host_pip_settings()
    ca_bundle = host_ca_bundle(settings)
    conf = folder / "pip.conf"
    conf.write_text(pip_conf(settings, ca_bundle))
    mounts = [f"{conf}:{PIP_CONF_IN_BUILD}:ro"]
    if ca_bundle is not None:
        mounts.append(f"{ca_bundle}:{CA_IN_BUILD}:ro")
    for key in PIP_PATHS:
        mounts += [f"{path}:{path}:ro" for path in local_paths(key, settings.get(key, ""))]
    pip_cache = Path.home() / ".cache" / "pip"
    pip_cache.mkdir(parents=True, exist_ok=True)
    mounts.append(f"{pip_cache}:/root/.cache/pip")
    llama_builds = Path.home() / ".cache" / "gpu-pool-serve"
    if llama_builds.is_dir():  # make install (image-test's prerequisite) made them
        mounts.append(f"{llama_builds}:{LLAMA_SEED}:ro")
    return [argument for mount in dict.fromkeys(mounts) for argument in ("-v", mount)]


def import_tree(tree: Path, tag: str) -> None:
    """A root filesystem as an image: `tar -C tree -c . | podman import - tag`."""
    with subprocess.Popen(["tar", "-C", str(tree), "-c", "."], stdout=subprocess.PIPE) as tar:
        assert tar.stdout is not None
        try:
            imported = subprocess.run(
                ["podman", "import", "-", tag], stdin=tar.stdout, capture_output=True,
                text=True, timeout=IMPORT_TIMEOUT_S, check=False,
            )  # fmt: skip
        finally:
            tar.stdout.close()  # an import that ended early must not leave tar blocked on a pipe
            tar.kill()
    assert imported.returncode == 0, imported.stderr


def image_tag() -> str:
    """This run's image: the one `image-build` made in this `make test`, or this session's."""
    return f"{IMAGE_NAME}:cpu-{os.environ.get(RUN_VARIABLE) or os.getpid()}"


def remove_stale_images(keep: str) -> None:
    """Images of runs that ended before their last phase (6 GB each). Without --force: one a
    container of another run still uses stays."""
    listed = subprocess.run(
        ["podman", "images", "--format", "{{.Repository}}:{{.Tag}}", IMAGE_NAME],
        capture_output=True, text=True, timeout=REMOVE_TIMEOUT_S, check=True,
    ).stdout.split()  # fmt: skip
    for tag in set(listed) - {keep}:
        subprocess.run(["podman", "rmi", tag], capture_output=True, timeout=REMOVE_TIMEOUT_S,
                       check=False)  # fmt: skip


def make_base(folder: Path) -> str:
    """A Debian 12 made here from Debian's packages (the image's BASE)."""
    tree = folder / "bookworm"
    try:
        run_logged(
            ["debootstrap", "--variant=minbase", "bookworm", str(tree), DEBIAN_MIRROR],
            folder / "debootstrap.log",
            DEBOOTSTRAP_TIMEOUT_S,
        )
        import_tree(tree, BASE_TAG)
    finally:
        subprocess.run(["rm", "-rf", str(tree)], check=True)  # 200 MB, owned by root
    return BASE_TAG


def build(tag: str, folder: Path) -> None:
    """deploy/docker/Dockerfile.cpu built on a base made here. TORCH_INDEX_URL empty: torch
    comes from this machine's pip configuration, as it did for the host's own make install."""
    started = time.monotonic()
    base = make_base(folder)
    print(f"\nbase image {base} made in {time.monotonic() - started:.0f} s")
    command = [
        "podman", "build", *BUILD_FLAGS, "-f", str(DOCKERFILE),
        "--build-arg", f"BASE={base}", "--build-arg", "TORCH_INDEX_URL=",
        *build_volumes(folder), "-t", tag, str(ROOT),
    ]  # fmt: skip
    try:
        run_logged(command, folder / "build.log", BUILD_TIMEOUT_S)
    finally:
        remove_image(base)
    print(f"image {tag} built in {time.monotonic() - started:.0f} s in all")


@pytest.fixture(scope="session")
def cpu_image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """This run's CPU image, built unless the run's build suite made it already."""
    tag = image_tag()
    remove_stale_images(keep=tag)
    exists = subprocess.run(["podman", "image", "exists", tag], check=False, timeout=60)
    if exists.returncode != 0:
        build(tag, tmp_path_factory.mktemp("build"))
    yield tag
    if os.environ.get(SUITE_VARIABLE) != BUILD_SUITE:
        remove_image(tag)
