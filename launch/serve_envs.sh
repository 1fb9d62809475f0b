#!/usr/bin/env bash
# Run environment servers (Open Reward Standard, `python -m avalon.envs.serve`) on worker 0,
# listening on its internal address so every worker of the pod (same VPC network) reaches it,
# and print the base URL to give the config (e.g. `--config.env.base_url=http://IP:PORT` for a
# config built like configs/ors_example.py).
#   launch/serve_envs.sh MODULE:FACTORY [MODULE:FACTORY ...]   (PORT=8080 by default)
#   launch/serve_envs.sh --stop
# Needs PROJECT, ZONE, TPU_NAME. DRY_RUN=1 prints the commands instead.
. "$(dirname "$0")/lib.sh"
need PROJECT ZONE TPU_NAME
PORT="${PORT:-8080}"
if [ "${1:-}" = "--stop" ]; then
  on_workers 0 'pkill -INT -f "avalon[.]envs[.]serve" || true'
  exit
fi
[ "$#" -ge 1 ] || { echo "usage: launch/serve_envs.sh MODULE:FACTORY [...]" >&2; exit 2; }
envs=""
for e in "$@"; do envs+=" --env=$(printf '%q' "$e")"; done
on_workers 0 "cd ~/avalon && nohup .venv/bin/python -m avalon.envs.serve$envs \
--host=\$(hostname -I | awk '{print \$1}') --port=$PORT > ~/envs.log 2>&1 &"
if dry; then
  cloud gcloud compute tpus tpu-vm describe "$TPU_NAME" --project="$PROJECT" --zone="$ZONE" \
    --format='value(networkEndpoints[0].ipAddress)' >&2
  ip="${DRY_RUN_IP:-10.0.0.2}"
else
  ip="$(gcloud compute tpus tpu-vm describe "$TPU_NAME" --project="$PROJECT" --zone="$ZONE" \
    --format='value(networkEndpoints[0].ipAddress)')"
fi
echo "http://$ip:$PORT"
