#!/usr/bin/env bash
# Create the TPU VM pod. Needs PROJECT, ZONE, TPU_NAME, ACCELERATOR (e.g. v5p-256).
#   SPOT=1 (default) spot capacity, SPOT=0 on-demand; QUEUED=1 asks through a queued resource
#   (waits for capacity instead of failing; `launch/supervise.sh` recreates it after a
#   preemption). DRY_RUN=1 prints the command instead.
. "$(dirname "$0")/lib.sh"
need PROJECT ZONE TPU_NAME ACCELERATOR
RUNTIME="${RUNTIME:-v2-alpha-tpuv5}"
spot=()
if [ "${SPOT:-1}" = "1" ]; then spot=(--spot); fi
if [ "${QUEUED:-0}" = "1" ]; then
  cloud gcloud compute tpus queued-resources create "$TPU_NAME" --node-id="$TPU_NAME" \
    --project="$PROJECT" --zone="$ZONE" --accelerator-type="$ACCELERATOR" \
    --runtime-version="$RUNTIME" ${spot[@]+"${spot[@]}"}
else
  cloud gcloud compute tpus tpu-vm create "$TPU_NAME" --project="$PROJECT" --zone="$ZONE" \
    --accelerator-type="$ACCELERATOR" --version="$RUNTIME" ${spot[@]+"${spot[@]}"}
fi
