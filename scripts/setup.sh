#!/usr/bin/env bash
# Idempotent setup: the main environment at .venv/ and the tiny local models (cached under .cache/). Each environment
# installs requirements/<env>-<device>.txt, the device from scripts/device.sh (PIPELINE_DEVICE=cpu|cuda, else cuda
# when nvidia-smi lists a GPU); PIPELINE_SETUP_DRY_RUN=1 prints what each would install and installs nothing.
set -euo pipefail
cd "$(dirname "$0")/.."

# The environments are independent installs, mostly one process each (pip unpacking, compiling bytecode): they are
# built in two lanes, one per core, the main environment first in lane 0, the engines' and the trainers' environments
# (scripts/engines/*.sh, scripts/trainers/*.sh) dealt out between both; Chromium and the models come after both
# lanes. Each lane logs to a file, printed after it. Editable installs of this checkout take a lock (they write
# pipeline.egg-info here).
mkdir -p .cache
export PIPELINE_SETUP_LOCK=$PWD/.cache/.setup-editable.lock
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT

main_env() {
    local py=${PYTHON:-python3.11} reqs
    reqs=requirements/main-$(bash scripts/device.sh).txt
    if [ -n "${PIPELINE_SETUP_DRY_RUN:-}" ]; then echo ".venv: -r $reqs -e .[dev,ray]"; return; fi
    if [ ! -x .venv/bin/python ]; then
        "$py" -m venv .venv
    fi
    local stamp=.venv/.installed-$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)
    if [ ! -f "$stamp" ]; then
        # torch first and pinned (on the CPU machines, the CPU build on their disk; an unpinned torch would pull
        # another build); the package after it.
        .venv/bin/pip install -q --disable-pip-version-check -r "$reqs"
        flock "$PIPELINE_SETUP_LOCK" .venv/bin/pip install -q --disable-pip-version-check -e ".[dev,ray]"
        if .venv/bin/pip show -q torchvision 2>/dev/null; then
            .venv/bin/pip uninstall -y -q torchvision
        fi
        rm -f .venv/.installed-*
        touch "$stamp"
    fi
}

# Engines that pin their own torch (vLLM, SGLang) get their own environments beside .venv (.venv-<engine>/);
# each script is idempotent and the pipeline runs those engines in a worker process there. The trainers whose
# layouts `python -m pipeline.export` writes (speculators, SpecForge) pin their own torch and transformers: each gets
# its own environment (.venv-<trainer>/), used only by the export tests' drivers.
side=()
for script in scripts/engines/*.sh scripts/trainers/*.sh; do
    [ -e "$script" ] && side+=("$script")
done

lane() {  # lane INDEX: this lane's share of the side environments, one after another
    local i
    for ((i = $1; i < ${#side[@]}; i += 2)); do
        bash "${side[$i]}"
    done
}

(main_env; lane 0) > "$logs/lane0" 2>&1 &
lane0=$!
(lane 1) > "$logs/lane1" 2>&1 &
lane1=$!
failed=0
for n in 0 1; do
    pid_var=lane$n
    status=0
    wait "${!pid_var}" || status=$?
    cat "$logs/lane$n"
    if [ "$status" != 0 ]; then
        echo "setup failed in lane $n (exit $status): its log is above" >&2
        failed=1
    fi
done
[ "$failed" = 0 ] || exit 1
if [ -n "${PIPELINE_SETUP_DRY_RUN:-}" ]; then exit 0; fi  # PIPELINE_SETUP_DRY_RUN=1: what each environment would get
# Headless Chromium renders the diff report in the tests (tests/integration/test_diff_report.py): Debian's package,
# installed only when it is missing and we are root (elsewhere that test skips and says why).
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt=(apt-get -o DPkg::Lock::Timeout=600)  # another apt (a second setup, unattended upgrades): wait for it, not fail
    "${apt[@]}" install -y -q chromium >/dev/null 2>&1 || { "${apt[@]}" update -q >/dev/null && "${apt[@]}" install -y -q chromium >/dev/null; }
fi
.venv/bin/python -m pipeline.factory
