#!/usr/bin/env bash
# The prepared GPU check (bench/gpu_check.py) for a lent GPU machine: PyTorch with CUDA, no vLLM, no
# package registry. snac (pure Python) travels as a wheel in .whl/ (bench/README.md says how);
# everything else it needs is on that machine's image. One command, JSON out, safe to rerun:
#
#   bash bench/gpu.sh                  # GPU: writes $OUT/gpu-check.json (or .cache/gpu-check/)
#   bash bench/gpu.sh --cpu            # every step at toy sizes on this CPU (what the test runs)
#   bash bench/gpu.sh --prepare        # here, once: fetch the snac wheel into .whl/ for carrying
#
# Extra arguments go to `python -m bench.gpu_check` (e.g. --block-imports vllm,pydantic,websockets
# rehearses the GPU machine's missing packages here). PYTHON picks the interpreter (default python3);
# GPU_CHECK_TIMEOUT_S bounds the run (default 450 s, inside the 8-minute budget); nothing is left
# running: the check is a foreground child of `timeout`, and the temporary site is removed on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
SNAC_VERSION=1.2.1

if [[ "${1:-}" == "--prepare" ]]; then
  "$PY" -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d .whl "snac==$SNAC_VERSION"
  git check-ignore -q .whl 2>/dev/null || echo "note: .whl/ is not ignored; add '/.whl/' to .gitignore" >&2
  exit 0
fi

if ! "$PY" -c "import snac" 2>/dev/null; then
  wheels=(.whl/snac-*.whl)
  if [[ ! -f "${wheels[0]}" ]]; then
    echo "error: snac is not installed and no .whl/snac-*.whl was carried (run 'bash bench/gpu.sh --prepare' here" \
         "and name .whl in carry)" >&2
    exit 2
  fi
  site=$(mktemp -d /tmp/voicering-gpu-site.XXXXXX)
  trap 'rm -rf "$site"' EXIT
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" "${wheels[0]}"
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
out_dir=${OUT:-.cache/gpu-check}
mkdir -p "$out_dir"
timeout --signal=TERM --kill-after=20 "${GPU_CHECK_TIMEOUT_S:-450}" \
  "$PY" -m bench.gpu_check --out "$out_dir/gpu-check.json" "$@"
