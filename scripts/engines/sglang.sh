#!/usr/bin/env bash
# Idempotent: SGLang 0.5.23 in its own environment, .venv-sglang/ (the recipe in docs/engines.md#sglang-environment).
# The pipeline runs the SGLang adapter in a worker process there (pipeline/engines/sglang/, via make_engine).
set -euo pipefail
cd "$(dirname "$0")/../.."

PY=${PYTHON:-python3.11}
VENV=.venv-sglang
PIP=(env PIP_DISABLE_PIP_VERSION_CHECK=1 "$VENV/bin/pip" install -q)
# SGLang's own torch pin. Every torch-dependent install below is constrained to it: an unconstrained resolve would
# replace it (and fetch several GB of another build).
TORCH=(torch==2.14.1 torchvision==0.29.1)
# SGLang's runtime imports, installed without sglang's full dependency set (that drags in CUDA kernels such as
# sgl-kernel and flashinfer). xgrammar brings triton, which a kvcache module imports at top level.
RUNTIME_DEPS=(aiohttp anthropic blobfile==3.0.0 einops fastapi gguf huggingface_hub interegular llguidance msgspec
    ninja numpy openai==2.8.0 openai-harmony==0.0.4 orjson packaging partial_json_parser pillow prometheus-client
    psutil pybase64 pydantic python-multipart pyzmq requests scipy sentencepiece setproctitle tiktoken tqdm
    transformers==5.19.0 tokenizers uvicorn uvloop watchfiles xxhash zstandard regex python-dateutil distro easydict
    IPython safetensors dill compressed-tensors xgrammar==0.2.7)

stamp="$VENV/.installed-$(sha256sum scripts/engines/sglang.sh | cut -c1-16)"
if [ -f "$stamp" ]; then
    exit 0
fi
if [ ! -x "$VENV/bin/python" ]; then
    "$PY" -m venv "$VENV"
fi
constraints=$(mktemp)
trap 'rm -f "$constraints"' EXIT
printf '%s\n' "${TORCH[@]}" > "$constraints"
"${PIP[@]}" "${TORCH[@]}"
if nvidia-smi -L >/dev/null 2>&1; then
    # A GPU machine: SGLang with its full dependency set (sgl-kernel, flashinfer, ...). Not exercised on the CPU
    # machines this script was written on.
    "${PIP[@]}" -c "$constraints" sglang==0.5.23
else
    # CPU: no sgl-kernel build exists on PyPI (pipeline/engines/sglang/cpu/ stands in for it at import time).
    "${PIP[@]}" --no-deps sglang==0.5.23
    # --no-warn-conflicts: pip would list every sglang requirement left out on purpose (CUDA kernels) as a conflict.
    "${PIP[@]}" --no-warn-conflicts -c "$constraints" "${RUNTIME_DEPS[@]}"
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
