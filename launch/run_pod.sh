#!/usr/bin/env bash
# Start (or resume) training on every worker of the pod:
#   launch/run_pod.sh CONFIG WORKDIR [extra avalon.main flags...]
#   launch/run_pod.sh --logs      # tail worker 0's log
#   launch/run_pod.sh --running   # prints "running" or "stopped" (worker 0)
#   launch/run_pod.sh --stop      # stop the training processes on every worker
# Needs PROJECT, ZONE, TPU_NAME. Each worker runs `python -m avalon.main --distributed_auto`
# under nohup (log: ~/avalon.log); JAX finds the pod's processes itself. Rerunning the same
# command resumes from the newest checkpoint in WORKDIR (a gs:// bucket every worker reads).
# DRY_RUN=1 prints the commands instead.
. "$(dirname "$0")/lib.sh"
need PROJECT ZONE TPU_NAME
case "${1:-}" in
  --logs) on_workers 0 'tail -f ~/avalon.log'; exit ;;
  --running)
    if dry; then on_workers 0 'pgrep -f "avalon[.]main" >/dev/null && echo running || echo stopped' >&2
      echo "${DRY_RUN_RUNNING:-stopped}"; exit; fi
    on_workers 0 'pgrep -f "avalon[.]main" >/dev/null && echo running || echo stopped'; exit ;;
  --stop) on_workers all 'pkill -INT -f "avalon[.]main" || true'; exit ;;
esac
config="${1:?usage: launch/run_pod.sh CONFIG WORKDIR [flags...]}"
workdir="${2:?usage: launch/run_pod.sh CONFIG WORKDIR [flags...]}"
shift 2
extra=""
for flag in "$@"; do extra+=" $(printf '%q' "$flag")"; done
# The memory-map limit: every compiled program holds JIT maps (README "Quickstart").
on_workers all "sudo sysctl -q -w vm.max_map_count=1048576; cd ~/avalon && \
nohup .venv/bin/python -m avalon.main --config=$config --workdir=$workdir --distributed_auto\
$extra > ~/avalon.log 2>&1 &"
