# Shared by the launch scripts (sourced). Every cloud command goes through `cloud`, so
# DRY_RUN=1 prints each one (a line starting "+ ") instead of running it; queries then answer
# from DRY_RUN_* variables (tests/launch/test_dry_run.py runs every script this way).
set -euo pipefail

LAUNCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_DIR="$(cd "$LAUNCH_DIR/.." && pwd)"

# The pinned stack of a pod worker (setup.py's `pod` extra pins the same): avalon needs
# Python >= 3.11 (stock TPU VM images have 3.10); jax 0.10.2 runs on libtpu 0.0.42.1.
PYTHON_VERSION="${PYTHON_VERSION:-3.11}"

dry() { [ "${DRY_RUN:-0}" = "1" ]; }

# One word as a POSIX shell reads it back (single quotes unless it needs none).
shell_word() {
  local q="'\\''"
  if [[ "$1" =~ ^[A-Za-z0-9_./:=@%+,-]+$ ]]; then
    printf '%s' "$1"
  else
    printf "'%s'" "${1//\'/$q}"
  fi
}

cloud() {
  if dry; then
    local word line="+"
    for word in "$@"; do line+=" $(shell_word "$word")"; done
    printf '%s\n' "$line"
  else
    "$@"
  fi
}

need() {
  local v
  for v in "$@"; do
    if [ -z "${!v:-}" ]; then
      echo "$(basename "$0"): set $v (see launch/README.md)" >&2
      exit 2
    fi
  done
}

# Run a shell command on one worker (0, 1, ...) or on every worker (all) of the pod.
on_workers() {
  local worker="$1"; shift
  cloud gcloud compute tpus tpu-vm ssh "$TPU_NAME" --worker="$worker" --project="$PROJECT" \
    --zone="$ZONE" --command="$*"
}

# The TPU VM's state (READY, CREATING, PREEMPTED, ...; NOT_FOUND when there is none).
tpu_state() {
  if dry; then
    cloud gcloud compute tpus tpu-vm describe "$TPU_NAME" --project="$PROJECT" --zone="$ZONE" \
      --format='value(state)' >&2
    echo "${DRY_RUN_TPU_STATE:-READY}"
    return
  fi
  gcloud compute tpus tpu-vm describe "$TPU_NAME" --project="$PROJECT" --zone="$ZONE" \
    --format='value(state)' 2>/dev/null || echo NOT_FOUND
}
