#!/usr/bin/env bash
# Prove GPU support on this machine: a one-node Corral cluster on free loopback ports,
# five checks of what its jobs see of the GPUs, a summary to paste into
# docs/benchmarks.md (docs/agent.md, "Checking a GPU node").
#
#   scripts/gpu_check.sh [--skip-torch] [--matmul-secs N] [--keep-state] [--job-python PATH]
#
# Needs the NVIDIA driver (nvidia-smi) and Python 3.11+; installs into the
# repository's .venv what is missing there: Corral itself, its `gpu` extra (NVML's
# bindings) and PyTorch (a few GB; none with --skip-torch or GPU_CHECK_SKIP_TORCH=1).
# GPU_CHECK_TORCH_PIP_ARGS replaces pip's arguments for PyTorch (default `torch`),
# e.g. `torch --index-url https://download.pytorch.org/whl/cu118` for an older driver.
# As root (through `sudo -n` where that needs no password, unless GPU_CHECK_NO_SUDO=1)
# its jobs run under uids and in cgroups of their own; otherwise as this user (it says which).
#
# Exit status: 0 all checks passed, 1 one failed, 2 this machine cannot run them
# (no nvidia-smi, no GPU, no PyTorch), 130 interrupted. scripts/gpu_check.py does the
# checks; it stops the cluster it started, and only that, however it ends.
set -euo pipefail

# Builtins only until nvidia-smi is found: without it nothing else is needed or done.
here=${BASH_SOURCE[0]%/*}
[[ $here == "${BASH_SOURCE[0]}" ]] && here=.
ROOT=$(cd "$here/.." && pwd)
VENV=$ROOT/.venv
PY=$VENV/bin/python

usage() {  # the comment at the top
    local line
    while IFS= read -r line; do
        [[ $line == '#!'* ]] && continue
        [[ $line == '#'* ]] || break
        line=${line#\#}
        echo "${line# }"
    done <"${BASH_SOURCE[0]}"
}

skip_torch=${GPU_CHECK_SKIP_TORCH:-0}
[[ $skip_torch == 0 ]] && skip_torch=""
for arg in "$@"; do
    case $arg in
        --skip-torch) skip_torch=1 ;;
        -h|--help) usage; exit 0 ;;
    esac
done

if ! command -v nvidia-smi >/dev/null 2>&1; then
    echo "gpu_check: nvidia-smi is not in PATH: this check needs a machine with NVIDIA GPUs and their driver" \
         "(nvidia-smi comes with it); nothing was started" >&2
    exit 2
fi

say() { echo "[gpu_check] $*"; }

if [[ ! -x $VENV/bin/corral-agent ]]; then
    say "making $VENV with Corral and its gpu extra"
    [[ -x $PY ]] || python3 -m venv "$VENV"
    "$PY" -m pip install --quiet --upgrade pip
    "$PY" -m pip install --quiet -e "$ROOT[gpu]"
elif ! "$PY" -c 'import pynvml' 2>/dev/null; then
    say "installing Corral's gpu extra (nvidia-ml-py) into $VENV"
    "$PY" -m pip install --quiet -e "$ROOT[gpu]"
fi

args=("$@")
if [[ -n $skip_torch ]]; then
    [[ " $* " == *" --skip-torch "* ]] || args+=(--skip-torch)
elif ! "$PY" -c 'import torch' 2>/dev/null; then
    read -r -a torch_args <<<"${GPU_CHECK_TORCH_PIP_ARGS:-torch}"
    say "installing PyTorch into $VENV: pip install ${torch_args[*]}"
    "$PY" -m pip install --quiet "${torch_args[@]}"
fi

run=("$PY" "$ROOT/scripts/gpu_check.py" "${args[@]}")
if [[ $EUID != 0 && ${GPU_CHECK_NO_SUDO:-0} == 0 ]] && command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
    say "not root: running the checks as root through sudo (GPU_CHECK_NO_SUDO=1: as this user)"
    run=(sudo -n env "PATH=$PATH" PYTHONDONTWRITEBYTECODE=1 "${run[@]}")
fi

# The checker runs in the background so that a signal to this script reaches it at
# once (bash runs a trap only between commands): it then stops its cluster and exits.
"${run[@]}" &
checker=$!
trap 'kill -TERM "$checker" 2>/dev/null || true' INT TERM HUP
status=0
while true; do
    if wait "$checker"; then status=0; else status=$?; fi
    kill -0 "$checker" 2>/dev/null || break  # a trap cut the wait short: wait again for its end
done
exit "$status"
