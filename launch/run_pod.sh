#!/usr/bin/env bash
# Start (or resume) training on every worker of the pod:
#   launch/run_pod.sh CONFIG WORKDIR [extra avalon.main flags...]
#   launch/run_pod.sh --logs          # tail worker 0's log
set -euo pipefail
: "${PROJECT:?set PROJECT}" "${ZONE:?set ZONE}" "${TPU_NAME:?set TPU_NAME}"
if [ "${1:-}" = "--logs" ]; then
  exec gcloud compute tpus tpu-vm ssh "$TPU_NAME" --worker=0 --project="$PROJECT" \
    --zone="$ZONE" --command='tail -f ~/avalon.log'
fi
config="${1:?config file}" workdir="${2:?workdir}"
shift 2
extra="$*"
gcloud compute tpus tpu-vm ssh "$TPU_NAME" --worker=all --project="$PROJECT" --zone="$ZONE" \
  --command="cd ~/avalon && . .venv/bin/activate && nohup python -m avalon.main \
    --config=$config --workdir=$workdir --distributed_auto $extra > ~/avalon.log 2>&1 &"
