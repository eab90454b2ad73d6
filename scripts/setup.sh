#!/usr/bin/env bash
# Idempotent setup: the main environment at .venv/ and the tiny local models (cached under .cache/).
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3.11}
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
stamp=.venv/.installed-$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)
if [ ! -f "$stamp" ]; then
    # torch first and pinned: the CPU build on this machine's disk; an unpinned torch would pull a CUDA build.
    .venv/bin/pip install -q --disable-pip-version-check torch==2.13.0
    .venv/bin/pip install -q --disable-pip-version-check -e ".[dev,ray]"
    if .venv/bin/pip show -q torchvision 2>/dev/null; then
        .venv/bin/pip uninstall -y -q torchvision
    fi
    rm -f .venv/.installed-*
    touch "$stamp"
fi
# Engines that pin their own torch (vLLM, SGLang) get their own environments beside .venv (.venv-<engine>/);
# each script is idempotent and the pipeline runs those engines in a worker process there.
for engine_setup in scripts/engines/*.sh; do
    [ -e "$engine_setup" ] || continue
    bash "$engine_setup"
done
# The trainers whose layouts `python -m pipeline.export` writes (speculators, SpecForge) pin their own torch and
# transformers: each gets its own environment (.venv-<trainer>/), used only by the export tests' drivers.
for trainer_setup in scripts/trainers/*.sh; do
    [ -e "$trainer_setup" ] || continue
    bash "$trainer_setup"
done
# Headless Chromium renders the diff report in the tests (tests/integration/test_diff_report.py): Debian's package,
# installed only when it is missing and we are root (elsewhere that test skips and says why).
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q chromium >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null; }
fi
.venv/bin/python -m pipeline.factory
