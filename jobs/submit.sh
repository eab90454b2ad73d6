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
# Right after `ray start` the dashboard can answer before the head's job agent has registered: Ray then refuses the
# submission ("No available agent to submit job", nothing submitted). This script waits for the agent: it retries
# that refusal only, up to PIPELINE_SUBMIT_ATTEMPTS times (default 10), PIPELINE_SUBMIT_RETRY_SECONDS apart (6), and
# says so on each retry.
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
ATTEMPTS=${PIPELINE_SUBMIT_ATTEMPTS:-10}
RETRY_SECONDS=${PIPELINE_SUBMIT_RETRY_SECONDS:-6}
NO_AGENT="No available agent to submit job"
# Ray's CLI writes its errors to stderr (the job's own output comes on stdout): kept for each attempt, shown unless
# they are the refusal this script retries.
errors=$(mktemp "${TMPDIR:-/tmp}/submit-errors.XXXXXX")
trap 'rm -f "$errors"' EXIT
for ((attempt = 1; ; attempt++)); do
    status=0
    ray job submit --address "$ADDRESS" --runtime-env jobs/runtime_env.yaml -- \
        "$PYTHON" -m pipeline.extract runner=ray runner.address=auto "$@" 2>"$errors" || status=$?
    if ((status != 0)) && grep -q "$NO_AGENT" "$errors" && ((attempt < ATTEMPTS)); then
        echo "submit.sh: the cluster's job agent is not up yet (Ray: \"$NO_AGENT\"; nothing was submitted);" \
            "retrying in ${RETRY_SECONDS}s (attempt $((attempt + 1)) of $ATTEMPTS)" >&2
        sleep "$RETRY_SECONDS"
        continue
    fi
    cat "$errors" >&2
    if ((status != 0)) && grep -q "$NO_AGENT" "$errors"; then
        echo "submit.sh: still no job agent after $ATTEMPTS attempts, $(((ATTEMPTS - 1) * RETRY_SECONDS))s apart" \
            "by ${RETRY_SECONDS}s; nothing was submitted: check the head node (ray status; its dashboard_agent.log)" \
            "and rerun this command, or raise PIPELINE_SUBMIT_ATTEMPTS" >&2
    fi
    exit "$status"
done
