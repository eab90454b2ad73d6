#!/usr/bin/env bash
# Idempotent: SGLang 0.5.23 in its own environment, .venv-sglang/ (the recipe in docs/engines.md#sglang-environment).
# The pipeline runs the SGLang adapter in a worker process there (pipeline/engines/sglang/, via make_engine).
set -euo pipefail
cd "$(dirname "$0")/../.."

PY=${PYTHON:-python3.11}
VENV=.venv-sglang
PIP=(env PIP_DISABLE_PIP_VERSION_CHECK=1 "$VENV/bin/pip" install -q)
# SGLang's own torch pin (requirements/sglang-torch.txt): every torch-dependent install below is constrained to it,
# as an unconstrained resolve would replace it (and fetch several GB of another build). What else is installed:
# requirements/sglang-$DEVICE.txt.
DEVICE=$(bash scripts/device.sh)
TORCH=requirements/sglang-torch.txt
REQS=requirements/sglang-$DEVICE.txt

stamp="$VENV/.installed-$(cat scripts/engines/sglang.sh "$TORCH" "$REQS" | sha256sum | cut -c1-16)"
if [ -n "${PIPELINE_SETUP_DRY_RUN:-}" ]; then echo "$VENV: -c $TORCH -r $REQS"; exit 0; fi
if [ -f "$stamp" ]; then
    exit 0
fi
if [ ! -x "$VENV/bin/python" ]; then
    "$PY" -m venv "$VENV"
fi
"${PIP[@]}" -r "$TORCH"
if [ "$DEVICE" = cuda ]; then
    # A GPU node: SGLang with its full dependency set (sgl-kernel, flashinfer, ...): resolved by the tests
    # (tests/unit/test_setup_device.py), never installed on the CPU machines this was written on.
    "${PIP[@]}" -c "$TORCH" -r "$REQS"
else
    # CPU: no sgl-kernel build exists on PyPI (pipeline/engines/sglang/cpu/ stands in for it at import time).
    "${PIP[@]}" --no-deps sglang==0.5.23
    # --no-warn-conflicts: pip would list every sglang requirement left out on purpose (CUDA kernels) as a conflict.
    "${PIP[@]}" --no-warn-conflicts -c "$TORCH" -r "$REQS"
fi
# The worker imports `pipeline` (engines.worker/wire/base, points, data.sample, the adapter) from this checkout;
# --no-deps keeps the pipeline's own torch pin (the CPU 2.13 build) out of this environment.
flock "${PIPELINE_SETUP_LOCK:-.}" "${PIP[@]}" --no-deps --no-warn-conflicts -e .
"$VENV/bin/python" - <<'EOF'
import importlib.metadata as md
import torch
want = {"torch": "2.14.1", "sglang": "0.5.23", "transformers": "5.19.0"}
got = {name: md.version(name) for name in want}
bad = {name: (got[name], v) for name, v in want.items() if not got[name].startswith(v)}
if bad:
    raise SystemExit(f".venv-sglang: wrong versions (installed, wanted): {bad}")
EOF
rm -f "$VENV"/.installed-*
touch "$stamp"
echo "SGLang environment ready: $VENV"
