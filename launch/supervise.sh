#!/usr/bin/env bash
# Keep a pod run going through preemptions, from a workstation (or a small always-on VM):
#   launch/supervise.sh CONFIG WORKDIR [extra avalon.main flags...]
# Every INTERVAL seconds (default 300) until WORKDIR/summary.json exists (the run finished):
#   - no TPU, or one that was preempted / stopped: delete it, create it again
#     (launch/create_pod.sh), copy and set up the code (copy_code.sh), stage the weights when
#     WEIGHTS is set (stage_weights.sh), start training (run_pod.sh), which resumes from the
#     newest checkpoint in WORKDIR;
#   - a READY TPU whose training is not running (a crash, a kill): start it again;
#   - anything else (creating, repairing): wait.
# At most MAX_RESTARTS (default 20) starts, then it stops and says so. WORKDIR must be a
# gs:// bucket (every worker and this supervisor read it). Needs PROJECT, ZONE, TPU_NAME,
# ACCELERATOR. DRY_RUN=1 runs one pass, printing every command, with the TPU's state taken from
# DRY_RUN_TPU_STATE (default PREEMPTED) and the run's from DRY_RUN_RUNNING / DRY_RUN_FINISHED.
. "$(dirname "$0")/lib.sh"
need PROJECT ZONE TPU_NAME ACCELERATOR
config="${1:?usage: launch/supervise.sh CONFIG WORKDIR [flags...]}"
workdir="${2:?usage: launch/supervise.sh CONFIG WORKDIR [flags...]}"
INTERVAL="${INTERVAL:-300}"
MAX_RESTARTS="${MAX_RESTARTS:-20}"
here="$(dirname "$0")"
if dry; then DRY_RUN_TPU_STATE="${DRY_RUN_TPU_STATE:-PREEMPTED}"; export DRY_RUN_TPU_STATE; fi

finished() {
  if dry; then
    cloud gcloud storage ls "$workdir/summary.json" >&2
    [ "${DRY_RUN_FINISHED:-0}" = "1" ]
    return
  fi
  gcloud storage ls "$workdir/summary.json" >/dev/null 2>&1
}

start() {
  starts=$((starts + 1))
  if [ "$starts" -gt "$MAX_RESTARTS" ]; then
    echo "supervise.sh: $MAX_RESTARTS starts used; stopping (raise MAX_RESTARTS to go on)" >&2
    exit 1
  fi
  echo "supervise.sh: start $starts: $*" >&2
  "$here/run_pod.sh" "$config" "$workdir" "${@:3}"
}

starts=0
while true; do
  if finished; then echo "supervise.sh: $workdir is finished"; exit 0; fi
  state="$(tpu_state)"
  case "$state" in
    NOT_FOUND|PREEMPTED|TERMINATED|STOPPED|SUSPENDED|FAILED)
      echo "supervise.sh: TPU $TPU_NAME is $state: recreating it" >&2
      if [ "$state" != NOT_FOUND ]; then
        if [ "${QUEUED:-0}" = "1" ]; then
          cloud gcloud compute tpus queued-resources delete "$TPU_NAME" --project="$PROJECT" \
            --zone="$ZONE" --force --quiet
        else
          cloud gcloud compute tpus tpu-vm delete "$TPU_NAME" --project="$PROJECT" \
            --zone="$ZONE" --quiet
        fi
      fi
      "$here/create_pod.sh"
      "$here/copy_code.sh"
      if [ -n "${WEIGHTS:-}" ]; then "$here/stage_weights.sh"; fi
      start "$config" "$workdir" "${@:3}"
      ;;
    READY)
      if [ "$("$here/run_pod.sh" --running)" != running ]; then
        start "$config" "$workdir" "${@:3}"
      fi
      ;;
    *) echo "supervise.sh: TPU $TPU_NAME is $state; waiting" >&2 ;;
  esac
  if dry; then exit 0; fi
  sleep "$INTERVAL"
done
