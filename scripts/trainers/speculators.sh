#!/usr/bin/env bash
# Idempotent: the speculators 0.9.0 trainer's own environment at .venv-speculators/ (it pins torch, transformers and
# datasets ranges of its own). The pipeline never imports speculators: the export tests run a small driver with this
# interpreter (tests/exports/drivers/) that loads an export through speculators' own ArrowDataset and EAGLE-3 model.
set -euo pipefail
cd "$(dirname "$0")/../.."

PY=${PYTHON:-python3.11}
VENV=.venv-speculators
PIP=(env PIP_DISABLE_PIP_VERSION_CHECK=1 "$VENV/bin/pip" install -q)
# The torch build on this machine's disk that speculators accepts (<=2.14.1). Every install below is constrained to
# it: an unconstrained resolve would fetch another build (several GB).
TORCH=(torch==2.14.1)
# What speculators.train.data (ArrowDataset), speculators.models.eagle3 and their imports need; speculators itself is
# installed --no-deps because it requires torchvision/torchaudio, which nothing of this needs.
DEPS=(hs-connectors==0.9.0 "datasets>=4.0.0,<=5.1.0" transformers==5.19.0 safetensors "numpy>=2,<=2.5.4" openai
    "loguru>=0.7.2,<=0.7.3" "pydantic>=2" "pydantic-settings>=2" rich "tqdm>=4.66.3,<=4.70.1" typer click httpx
    aiohttp psutil protobuf huggingface-hub)

stamp="$VENV/.installed-$(sha256sum scripts/trainers/speculators.sh | cut -c1-16)"
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
"${PIP[@]}" --no-deps speculators==0.9.0
"${PIP[@]}" --no-warn-conflicts -c "$constraints" "${DEPS[@]}"
"$VENV/bin/python" - <<'PYEOF'
import importlib.metadata as md
want = {"torch": "2.14.1", "speculators": "0.9.0", "hs-connectors": "0.9.0"}
bad = {n: (md.version(n), v) for n, v in want.items() if not md.version(n).startswith(v)}
if bad:
    raise SystemExit(f".venv-speculators: wrong versions (installed, wanted): {bad}")
import speculators.train.data, speculators.models.eagle3  # noqa: E401,F401  the classes the tests drive
PYEOF
rm -f "$VENV"/.installed-*
touch "$stamp"
echo "speculators environment ready: $VENV"
