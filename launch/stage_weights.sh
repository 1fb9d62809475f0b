#!/usr/bin/env bash
# Put the base checkpoint (a Hugging Face directory: config.json, safetensors shards,
# tokenizer files) where the config's `init_from` names it, on every worker.
#   WEIGHTS=gs://BUCKET/PREFIX/NAME   the checkpoint directory in a bucket
#   MOUNT=/mnt/checkpoints            where NAME appears (the pod config reads
#                                     /mnt/checkpoints/NVIDIA-Nemotron-3-Super-120B-A12B-Base-BF16)
#   MODE=stream (default)  gcsfuse mounts gs://BUCKET/PREFIX read-only at MOUNT: the importer
#                          memory-maps each shard through it and every host reads only the
#                          slices its chips hold (no copy, no disk); the first import is as
#                          fast as the bucket streams.
#   MODE=copy              gcloud storage rsync onto each worker's own disk under MOUNT (after
#                          checking it has room): later imports read local files.
# Needs PROJECT, ZONE, TPU_NAME, WEIGHTS. DRY_RUN=1 prints the commands instead.
. "$(dirname "$0")/lib.sh"
need PROJECT ZONE TPU_NAME WEIGHTS
MOUNT="${MOUNT:-/mnt/checkpoints}"
MODE="${MODE:-stream}"
case "$WEIGHTS" in
  gs://*/*) ;;
  *) echo "stage_weights.sh: WEIGHTS=$WEIGHTS: must be gs://BUCKET/[PREFIX/]NAME" >&2; exit 2 ;;
esac
path="${WEIGHTS#gs://}"; path="${path%/}"
bucket="${path%%/*}"
rest="${path#*/}"
name="${rest##*/}"
prefix=""
if [ "$rest" != "$name" ]; then prefix="${rest%/*}"; fi
case "$MODE" in
  stream)
    only=""
    if [ -n "$prefix" ]; then only="--only-dir=$prefix"; fi
    on_workers all "set -e
if ! command -v gcsfuse >/dev/null; then
  echo 'deb [signed-by=/usr/share/keyrings/cloud.google.asc] https://packages.cloud.google.com/apt gcsfuse-'\$(lsb_release -cs)' main' | sudo tee /etc/apt/sources.list.d/gcsfuse.list >/dev/null
  curl -fsSL https://packages.cloud.google.com/apt/doc/apt-key.gpg | sudo tee /usr/share/keyrings/cloud.google.asc >/dev/null
  sudo apt-get update -q && sudo apt-get install -y -q gcsfuse
fi
sudo mkdir -p $MOUNT && sudo chown \$(id -u):\$(id -g) $MOUNT
mountpoint -q $MOUNT || gcsfuse --implicit-dirs -o ro $only $bucket $MOUNT
test -f $MOUNT/$name/config.json"
    ;;
  copy)
    on_workers all "set -e
sudo mkdir -p $MOUNT/$name && sudo chown -R \$(id -u):\$(id -g) $MOUNT
need=\$(gcloud storage du -s $WEIGHTS | awk '{print \$1}')
free=\$(df --output=avail -B1 $MOUNT | tail -1)
if [ \"\$need\" -gt \"\$free\" ]; then echo \"stage_weights: $WEIGHTS needs \$need bytes, $MOUNT has \$free free\" >&2; exit 1; fi
gcloud storage rsync -r $WEIGHTS $MOUNT/$name
test -f $MOUNT/$name/config.json"
    ;;
  *) echo "stage_weights.sh: MODE=$MODE: must be stream or copy" >&2; exit 2 ;;
esac
