#!/usr/bin/env bash
# Create a TPU VM pod for Avalon. Needs PROJECT, ZONE, TPU_NAME, ACCELERATOR (e.g. v5p-256).
set -euo pipefail
: "${PROJECT:?set PROJECT}" "${ZONE:?set ZONE}" "${TPU_NAME:?set TPU_NAME}"
: "${ACCELERATOR:?set ACCELERATOR, e.g. v5p-256}"
RUNTIME="${RUNTIME:-v2-alpha-tpuv5}"
spot=()
if [ "${SPOT:-1}" = "1" ]; then spot=(--spot); fi
gcloud compute tpus tpu-vm create "$TPU_NAME" --project="$PROJECT" --zone="$ZONE" \
  --accelerator-type="$ACCELERATOR" --version="$RUNTIME" "${spot[@]}"
