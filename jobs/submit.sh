#!/usr/bin/env bash
# Submit an extract job to an existing Ray cluster:
#   RAY_ADDRESS=http://head:8265 jobs/submit.sh +exp=kimi model.path=/models/Kimi-K2.5 data.path=/data/conv.jsonl \
#       out_dir=/shared/runs/kimi-eagle3
# Extra arguments are Hydra overrides for `python -m pipeline.extract`; the runner is Ray on the cluster the job
# runs in. Rerunning the same command on the same out_dir resumes an interrupted run.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${RAY_ADDRESS:?set RAY_ADDRESS to the cluster dashboard, e.g. http://127.0.0.1:8265}"
PYTHON=${PIPELINE_PYTHON:-python}
exec ray job submit --address "$RAY_ADDRESS" --runtime-env jobs/runtime_env.yaml -- \
    "$PYTHON" -m pipeline.extract runner=ray runner.address=auto "$@"
