#!/usr/bin/env bash
# Keep a pod run going through preemptions, from a workstation (or a small always-on VM):
#   launch/supervise.sh CONFIG WORKDIR [extra avalon.main flags...]
# Every INTERVAL seconds (default 300) until WORKDIR/summary.json exists (the run finished):
#   - no TPU, or one that was preempted / stopped: delete it, create it again
#     (launch/create_pod.sh); once it is READY, copy and set up the code (copy_code.sh), stage
#     the weights when WEIGHTS is set (stage_weights.sh) and start training (run_pod.sh), which
#     resumes from the newest checkpoint in WORKDIR;
#   - a READY TPU whose training is not running (a crash, a kill): start it again;
#   - anything else (creating, repairing, a queued resource waiting for capacity): wait.
# With QUEUED=1 the pod is a queued resource: its state (WAITING_FOR_RESOURCES, PROVISIONING,
# ACTIVE, SUSPENDED after a preemption, FAILED, ...) decides, and `create` returns before the TPU
# exists, so the code is copied on a later pass, when the TPU is READY.
# A step that fails (an ssh that drops, a create refused for capacity) is said and tried again
# on the next pass; the supervisor itself does not stop. At most MAX_RESTARTS (default 20)
# starts, then it stops and says so. WORKDIR must be a gs:// bucket (every worker and this
# supervisor read it). Needs PROJECT, ZONE, TPU_NAME, ACCELERATOR.
# DRY_RUN=1 runs DRY_RUN_PASSES passes (default 1) without sleeping, printing every command;
# pass i takes the TPU's state from the i-th word of DRY_RUN_TPU_STATE (default PREEMPTED; the
# last word repeats), the queued resource's from DRY_RUN_QUEUED_STATE (default SUSPENDED), and
# the run's from DRY_RUN_RUNNING / DRY_RUN_FINISHED.
. "$(dirname "$0")/lib.sh"
need PROJECT ZONE TPU_NAME ACCELERATOR
config="${1:?usage: launch/supervise.sh CONFIG WORKDIR [flags...]}"
workdir="${2:?usage: launch/supervise.sh CONFIG WORKDIR [flags...]}"
INTERVAL="${INTERVAL:-300}"
MAX_RESTARTS="${MAX_RESTARTS:-20}"
QUEUED="${QUEUED:-0}"
here="$(dirname "$0")"
dry_tpu_states=(${DRY_RUN_TPU_STATE:-PREEMPTED})
dry_queued_states=(${DRY_RUN_QUEUED_STATE:-SUSPENDED})

# The i-th word of a dry run's list of states (the last repeats).
dry_state() {
  local -n states="$1"
  local i=$(( pass < ${#states[@]} ? pass : ${#states[@]} - 1 ))
  echo "${states[$i]}"
}

finished() {
  if dry; then
    cloud gcloud storage ls "$workdir/summary.json" >&2
    [ "${DRY_RUN_FINISHED:-0}" = "1" ]
    return
  fi
  gcloud storage ls "$workdir/summary.json" >/dev/null 2>&1
}

# The queued resource's state (NOT_FOUND when there is none).
queued_state() {
  if dry; then
    cloud gcloud compute tpus queued-resources describe "$TPU_NAME" --project="$PROJECT" \
      --zone="$ZONE" --format='value(state.state)' >&2
    dry_state dry_queued_states
    return
  fi
  gcloud compute tpus queued-resources describe "$TPU_NAME" --project="$PROJECT" \
    --zone="$ZONE" --format='value(state.state)' 2>/dev/null || echo NOT_FOUND
}

# What to do and the state that says so: "RECREATE <state>", "READY" (the TPU is up) or
# "WAIT <state>".
pod_state() {
  if [ "$QUEUED" = "1" ]; then
    local q
    q="$(queued_state)"
    case "$q" in
      NOT_FOUND|SUSPENDED|FAILED) echo "RECREATE $q"; return ;;
      ACTIVE) ;;
      *) echo "WAIT $q"; return ;;
    esac
  fi
  local s
  if dry; then DRY_RUN_TPU_STATE="$(dry_state dry_tpu_states)"; fi
  s="$(tpu_state)"
  case "$s" in
    NOT_FOUND|PREEMPTED|TERMINATED|STOPPED|SUSPENDED|FAILED) echo "RECREATE $s" ;;
    READY) echo READY ;;
    *) echo "WAIT $s" ;;
  esac
}

recreate() {
  if [ "$QUEUED" = "1" ]; then
    # --force deletes the node with it; a queued resource that is not there is no error.
    cloud gcloud compute tpus queued-resources delete "$TPU_NAME" --project="$PROJECT" \
      --zone="$ZONE" --force --quiet || true
  elif [ "$1" != NOT_FOUND ]; then
    cloud gcloud compute tpus tpu-vm delete "$TPU_NAME" --project="$PROJECT" \
      --zone="$ZONE" --quiet
  fi
  "$here/create_pod.sh"
}

start() {
  starts=$((starts + 1))
  if [ "$starts" -gt "$MAX_RESTARTS" ]; then
    echo "supervise.sh: $MAX_RESTARTS starts used; stopping (raise MAX_RESTARTS to go on)" >&2
    exit 1
  fi
  echo "supervise.sh: start $starts" >&2
  "$here/run_pod.sh" "$config" "$workdir" "${@}"
}

# A fresh TPU: the code, its Python, the weights, then training.
set_up_and_start() {
  "$here/copy_code.sh" && { [ -z "${WEIGHTS:-}" ] || "$here/stage_weights.sh"; } \
    && start "$@"
}

starts=0
pass=0
fresh=0  # a TPU this supervisor created that has no code yet
while true; do
  if finished; then echo "supervise.sh: $workdir is finished"; exit 0; fi
  read -r action state <<< "$(pod_state)"
  case "$action" in
    RECREATE)
      echo "supervise.sh: TPU $TPU_NAME is $state: recreating it" >&2
      if recreate "$state"; then
        fresh=1
        # A queued resource's TPU comes later; a direct create returns with it READY.
        if [ "$QUEUED" != "1" ]; then
          if set_up_and_start "${@:3}"; then fresh=0
          else echo "supervise.sh: setting up the new TPU failed; retrying next pass" >&2; fi
        fi
      else
        echo "supervise.sh: creating the TPU failed; retrying next pass" >&2
      fi
      ;;
    READY)
      if [ "$fresh" = "1" ]; then
        if set_up_and_start "${@:3}"; then fresh=0
        else echo "supervise.sh: setting up the new TPU failed; retrying next pass" >&2; fi
      elif [ "$("$here/run_pod.sh" --running || echo unknown)" = stopped ]; then
        start "${@:3}" || echo "supervise.sh: starting training failed; retrying next pass" >&2
      fi
      ;;
    *) echo "supervise.sh: TPU $TPU_NAME is $state; waiting" >&2 ;;
  esac
  pass=$((pass + 1))
  if dry; then
    if [ "$pass" -ge "${DRY_RUN_PASSES:-1}" ]; then exit 0; fi
    continue
  fi
  sleep "$INTERVAL"
done
