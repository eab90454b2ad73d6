#!/usr/bin/env bash
# Idempotent: the speculators 0.9.0 trainer's own environment at .venv-speculators/ (it pins torch, transformers and
# datasets ranges of its own). Only pipeline/trainers/ imports speculators, and only with this interpreter (so do the
# export tests' drivers, tests/exports/drivers/); the pipeline is installed here --no-deps for it.
set -euo pipefail
cd "$(dirname "$0")/../.."

PY=${PYTHON:-python3.11}
VENV=.venv-speculators
PIP=(env PIP_DISABLE_PIP_VERSION_CHECK=1 "$VENV/bin/pip" install -q)
# The torch build on this machine's disk that speculators accepts (<=2.14.1). Every install below is constrained to
# it: an unconstrained resolve would fetch another build (several GB).
# The torch build this trainer accepts (requirements/speculators-torch.txt; on the CPU machines, the build on their disk,
# elsewhere PyPI's CUDA one): every install below is constrained to it. What its data loaders and EAGLE-3 draft
# import: requirements/speculators.txt; speculators==0.9.0 itself goes in --no-deps.
TORCH=requirements/speculators-torch.txt
REQS=requirements/speculators.txt

stamp="$VENV/.installed-$(cat scripts/trainers/speculators.sh "$TORCH" "$REQS" | sha256sum | cut -c1-16)"
if [ -n "${PIPELINE_SETUP_DRY_RUN:-}" ]; then echo "$VENV: -c $TORCH -r $REQS"; exit 0; fi
if [ -f "$stamp" ]; then
    exit 0
fi
if [ ! -x "$VENV/bin/python" ]; then
    "$PY" -m venv "$VENV"
fi
"${PIP[@]}" -r "$TORCH"
"${PIP[@]}" --no-deps speculators==0.9.0
"${PIP[@]}" --no-warn-conflicts -c "$TORCH" -r "$REQS"
# The pipeline itself, for `python -m pipeline.trainers.speculators` (speculators' CLI with the backend that reads a
# run's shards): --no-deps keeps the pipeline's own pins out of this environment; what it imports is in $REQS.
flock "${PIPELINE_SETUP_LOCK:-.}" "${PIP[@]}" --no-deps -e .
"$VENV/bin/python" - <<'PYEOF'
import importlib.metadata as md
want = {"torch": "2.14.1", "speculators": "0.9.0", "hs-connectors": "0.9.0"}
bad = {n: (md.version(n), v) for n, v in want.items() if not md.version(n).startswith(v)}
if bad:
    raise SystemExit(f".venv-speculators: wrong versions (installed, wanted): {bad}")
import speculators.train.data, speculators.models.eagle3  # noqa: E401,F401  the classes the tests drive
import pipeline.trainers.speculators_backend  # noqa: F401  the backend registers in this environment
PYEOF
rm -f "$VENV"/.installed-*
touch "$stamp"
echo "speculators environment ready: $VENV"
