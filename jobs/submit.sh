#!/usr/bin/env bash
# Submit an extract job to an existing Ray cluster, through its dashboard reached on this machine (jobs/README.md):
#   kubectl port-forward svc/CLUSTER-head-svc 8265:8265     # KubeRay; or: ssh -L 8265:127.0.0.1:8265 HEAD (VMs)
#   jobs/submit.sh +exp=kimi model.path=/models/Kimi-K2.5 data.path=/data/conv.jsonl out_dir=/shared/runs/kimi-eagle3
# Extra arguments are Hydra overrides for `python -m pipeline.extract`; the runner is Ray on the cluster the job
# runs in. Rerunning the same command on the same out_dir resumes an interrupted run.
# The job-submission API runs any code it is sent, so this script submits only with Ray's token authentication
# (RAY_AUTH_MODE=token): the token comes from RAY_AUTH_TOKEN, the file RAY_AUTH_TOKEN_PATH, or ~/.ray/auth_token.
# RAY_ADDRESS (default http://127.0.0.1:8265) must be on this machine or https://: plain http to another host would
# carry the token in clear text (PIPELINE_ALLOW_REMOTE_DASHBOARD=1 accepts it, e.g. on a trusted private network).
set -euo pipefail
cd "$(dirname "$0")/.."
ADDRESS=${RAY_ADDRESS:-http://127.0.0.1:8265}
case "$ADDRESS" in
    http://127.0.0.1:* | http://localhost:* | "http://[::1]:"* | 127.0.0.1:* | localhost:* | https://*) ;;
    *)
        if [[ "${PIPELINE_ALLOW_REMOTE_DASHBOARD:-0}" != 1 ]]; then
            echo "submit.sh: RAY_ADDRESS=$ADDRESS is a dashboard on another host over plain http, which would carry" \
                "the auth token in clear text; reach it on 127.0.0.1 through kubectl port-forward or an ssh tunnel" \
                "(jobs/README.md#security), or set PIPELINE_ALLOW_REMOTE_DASHBOARD=1" >&2
            exit 2
        fi
        ;;
esac
TOKEN_FILE=${RAY_AUTH_TOKEN_PATH:-$HOME/.ray/auth_token}
if [[ -z "${RAY_AUTH_TOKEN:-}" && ! -s "$TOKEN_FILE" ]]; then
    echo "submit.sh: no Ray auth token: set RAY_AUTH_TOKEN, or write the cluster's token to $TOKEN_FILE" \
        "(jobs/README.md#security says where a cluster keeps it)" >&2
    exit 2
fi
export RAY_AUTH_MODE=token  # Ray 2.60's CLI sends the token only in token mode
PYTHON=${PIPELINE_PYTHON:-python}
exec ray job submit --address "$ADDRESS" --runtime-env jobs/runtime_env.yaml -- \
    "$PYTHON" -m pipeline.extract runner=ray runner.address=auto "$@"
