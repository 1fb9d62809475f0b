#!/usr/bin/env bash
# Copy this checkout (its committed HEAD) to every worker and set it up there
# (launch/worker_setup.sh: Python 3.11, the pinned jax/libtpu, avalon's `pod` extra).
# Needs PROJECT, ZONE, TPU_NAME. DRY_RUN=1 prints the commands instead.
. "$(dirname "$0")/lib.sh"
need PROJECT ZONE TPU_NAME
archive="${TMPDIR:-/tmp}/avalon-$TPU_NAME.tar.gz"
cloud git -C "$REPO_DIR" archive --format=tar.gz -o "$archive" HEAD
cloud gcloud compute tpus tpu-vm scp "$archive" "$TPU_NAME":avalon.tar.gz --worker=all \
  --project="$PROJECT" --zone="$ZONE"
on_workers all "set -e; rm -rf ~/avalon && mkdir ~/avalon && tar -xzf ~/avalon.tar.gz -C ~/avalon \
&& PYTHON_VERSION=$PYTHON_VERSION bash ~/avalon/launch/worker_setup.sh"
