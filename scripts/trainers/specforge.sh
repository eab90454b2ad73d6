#!/usr/bin/env bash
# Idempotent: the SpecForge 0.2.0 trainer's own environment at .venv-specforge/. SpecForge pins torch 2.11.0,
# transformers 5.8.1 and sglang 0.5.14 (its online capture); its offline data plane and EAGLE-3 draft need none of
# sglang, so SpecForge is installed --no-deps on the torch build this machine holds, with what those modules import.
# The pipeline never imports specforge; the export tests run a driver with this interpreter (tests/exports/drivers/).
set -euo pipefail
cd "$(dirname "$0")/../.."

PY=${PYTHON:-python3.11}
VENV=.venv-specforge
PIP=(env PIP_DISABLE_PIP_VERSION_CHECK=1 "$VENV/bin/pip" install -q)
# The torch build this trainer accepts (requirements/specforge-torch.txt; on the CPU machines, the build on their disk,
# elsewhere PyPI's CUDA one): every install below is constrained to it. What its data loaders and EAGLE-3 draft
# import: requirements/specforge.txt; specforge==0.2.0 itself goes in --no-deps.
TORCH=requirements/specforge-torch.txt
REQS=requirements/specforge.txt

stamp="$VENV/.installed-$(cat scripts/trainers/specforge.sh "$TORCH" "$REQS" | sha256sum | cut -c1-16)"
if [ -n "${PIPELINE_SETUP_DRY_RUN:-}" ]; then echo "$VENV: -c $TORCH -r $REQS"; exit 0; fi
if [ -f "$stamp" ]; then
    exit 0
fi
if [ ! -x "$VENV/bin/python" ]; then
    "$PY" -m venv "$VENV"
fi
"${PIP[@]}" -r "$TORCH"
"${PIP[@]}" --no-deps specforge==0.2.0
# --no-warn-conflicts: pip would list sglang, wandb, yunchang and the torch pin, left out on purpose, as conflicts.
"${PIP[@]}" --no-warn-conflicts -c "$TORCH" -r "$REQS"
"$VENV/bin/python" - <<'PYEOF'
import importlib.metadata as md
want = {"torch": "2.14.1", "specforge": "0.2.0"}
bad = {n: (md.version(n), v) for n, v in want.items() if not md.version(n).startswith(v)}
if bad:
    raise SystemExit(f".venv-specforge: wrong versions (installed, wanted): {bad}")
import specforge.data.preprocessing, specforge.runtime.data_plane.offline_reader  # noqa: E401,F401
PYEOF
rm -f "$VENV"/.installed-*
touch "$stamp"
echo "SpecForge environment ready: $VENV"
