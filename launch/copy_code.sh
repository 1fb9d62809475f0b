#!/usr/bin/env bash
# Copy this checkout to every worker of the pod and install it (with JAX for TPU).
set -euo pipefail
: "${PROJECT:?set PROJECT}" "${ZONE:?set ZONE}" "${TPU_NAME:?set TPU_NAME}"
here="$(cd "$(dirname "$0")/.." && pwd)"
archive="$(mktemp -d)/avalon.tar.gz"
git -C "$here" archive --format=tar.gz -o "$archive" HEAD
gcloud compute tpus tpu-vm scp "$archive" "$TPU_NAME":~/avalon.tar.gz --worker=all \
  --project="$PROJECT" --zone="$ZONE"
gcloud compute tpus tpu-vm ssh "$TPU_NAME" --worker=all --project="$PROJECT" --zone="$ZONE" \
  --command='set -e; rm -rf ~/avalon && mkdir ~/avalon && tar -xzf ~/avalon.tar.gz -C ~/avalon
    python3 -m venv ~/avalon/.venv && . ~/avalon/.venv/bin/activate
    pip install -q --upgrade pip && pip install -q -e "$HOME/avalon[gcs]" "jax[tpu]" safetensors tokenizers'
