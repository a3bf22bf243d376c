#!/usr/bin/env bash
# Device check on a GPU or TPU machine: installs what it needs, then runs
# benchmarks/device_check.py (compiled Pallas kernel vs reference; scoring, decode and
# train-step throughput at Qwen2.5-1.5B shapes; RESULT lines; a block appended to
# benchmarks/RESULTS.md). Finishes within 10 minutes on one H200 (install included, with a
# fast link to PyPI).
#
#   bash benchmarks/device_check.sh                  # on the accelerator machine
#   bash benchmarks/device_check.sh --dry-run        # tiny shapes on CPU (what CI runs)
#
# Environment:
#   PY          python used to create the venv (default python3; 3.11+)
#   VENV        the venv (default .venv in the repository; reused when present)
#   JAX_EXTRA   accelerator build of our pinned jax: cuda12 (default on NVIDIA), cuda13, tpu
#   WHEELHOUSE  a folder of wheels for a machine without PyPI access (pip download them
#               elsewhere: pip download -d wheels "jax[cuda12]==0.10.2" -e .)
# Other arguments go to device_check.py (--only, --out, --peak-tflops, --peak-gbs, ...).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PY:-python3}"
VENV="${VENV:-$ROOT/.venv}"
JAX_VERSION="$(sed -n 's/^ *"jax==\([0-9.]*\)".*/\1/p' pyproject.toml)"
if [ -z "$JAX_VERSION" ]; then
  echo "device_check.sh: no jax==X pin found in pyproject.toml" >&2
  exit 2
fi

DRY=0
for arg in "$@"; do
  [ "$arg" = "--dry-run" ] && DRY=1
done

pip_install() {
  if [ -n "${WHEELHOUSE:-}" ]; then
    "$VENV/bin/pip" install -q --no-index --find-links "$WHEELHOUSE" "$@"
  else
    "$VENV/bin/pip" install -q "$@"
  fi
}

if [ "$DRY" = 1 ]; then
  # Same code paths at tiny shapes on the CPU build already installed (make install).
  if [ ! -x "$VENV/bin/python" ]; then
    echo "device_check.sh --dry-run: no venv at $VENV (run make install)" >&2
    exit 2
  fi
  export JAX_PLATFORMS=cpu
  exec "$VENV/bin/python" benchmarks/device_check.py "$@"
fi

if [ -z "${JAX_EXTRA:-}" ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    JAX_EXTRA=cuda12
  elif ls /dev/accel* /dev/vfio/[0-9]* >/dev/null 2>&1 || [ -n "${TPU_NAME:-}" ]; then
    JAX_EXTRA=tpu
  else
    echo "device_check.sh: no NVIDIA GPU (nvidia-smi) or TPU (/dev/accel*, /dev/vfio) found;" \
         "set JAX_EXTRA, or use --dry-run" >&2
    exit 2
  fi
fi

start=$(date +%s)
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
  pip_install --upgrade pip
fi
# The library and its runtime dependencies (not the test/reference extras), then the
# accelerator jaxlib plugin of the same jax version.
if ! "$VENV/bin/python" -c "import jaxdm" >/dev/null 2>&1; then
  pip_install -e "$ROOT"
fi
pip_install "jax[$JAX_EXTRA]==$JAX_VERSION"
echo "# device_check.sh: jax[$JAX_EXTRA]==$JAX_VERSION ready in $(( $(date +%s) - start )) s"
"$VENV/bin/python" -c "import jax; print('# devices:', jax.devices())"
exec "$VENV/bin/python" benchmarks/device_check.py --budget-s "${BUDGET_S:-480}" "$@"
