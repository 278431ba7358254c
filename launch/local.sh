#!/usr/bin/env bash
# Run sagc-jax on this machine's CPU: one process with N fake devices, or P local processes
# (a real multi-process jax.distributed run over localhost, gloo collectives) with N each.
#
#   launch/local.sh [-n DEVICES] [-p PROCESSES] [-c COMMAND] CONFIG [ARGS ...]
#
#   -n DEVICES     fake CPU devices per process (XLA --xla_force_host_platform_device_count);
#                  default 4
#   -p PROCESSES   local processes; default 1. With P > 1 a free localhost port becomes the
#                  coordinator and process i gets JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES /
#                  JAX_PROCESS_ID, which `distributed.initialize: auto` picks up. Process 0
#                  prints to the terminal; the others log to $LOG_DIR/sagc-local-p<i>.log.
#   -c COMMAND     sagc-jax sub-command (default: train)
#   ARGS           passed on, e.g. --dry-run or key=value overrides
#
# Examples:
#   launch/local.sh configs/tiny_cpu.yaml run.steps=20
#   launch/local.sh -n 2 -p 2 configs/tiny_cpu.yaml run.dir=runs/mp run.steps=5
#   launch/local.sh -n 16 configs/qwen2.5-1.5b_gsm8k_tpu-v5e-16.yaml --dry-run model.path=DIR
#
# Env: SAGC_JAX (the CLI to run; default `sagc-jax`, falling back to `python -m sagc_jax.cli`),
#      LOG_DIR (default: a fresh temp dir), JAX_COMPILATION_CACHE_DIR (default ~/.cache/sagc-jax).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"

devices=4
procs=1
cmd=train
usage() { sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//'; }
while getopts "n:p:c:h" opt; do
  case "$opt" in
    n) devices=$OPTARG ;;
    p) procs=$OPTARG ;;
    c) cmd=$OPTARG ;;
    h) usage; exit 0 ;;
    *) usage >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
if [[ $# -lt 1 ]]; then
  usage >&2
  exit 2
fi
config=$1
shift
require_config local.sh "$config"

resolve_cli

export JAX_PLATFORMS=cpu
export XLA_FLAGS="--xla_force_host_platform_device_count=${devices} ${XLA_FLAGS:-}"
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-$HOME/.cache/sagc-jax/jax}
export TOKENIZERS_PARALLELISM=false

if [[ $procs -le 1 ]]; then
  exec "${cli[@]}" "$cmd" --config "$config" "$@"
fi

port=$(python - <<'PY'
import socket
s = socket.socket()
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])
s.close()
PY
)
log_dir=${LOG_DIR:-$(mktemp -d -t sagc-local-XXXXXX)}
mkdir -p "$log_dir"
export JAX_COORDINATOR_ADDRESS="localhost:${port}"
export JAX_NUM_PROCESSES=$procs
echo "local.sh: $procs processes x $devices CPU devices, coordinator $JAX_COORDINATOR_ADDRESS," \
  "logs of processes 1..$((procs - 1)) in $log_dir" >&2

pids=()
cleanup() {
  for pid in "${pids[@]}"; do
    kill "$pid" 2>/dev/null || true
  done
}
trap cleanup INT TERM

for ((i = 1; i < procs; i++)); do
  JAX_PROCESS_ID=$i "${cli[@]}" "$cmd" --config "$config" "$@" \
    >"$log_dir/sagc-local-p$i.log" 2>&1 &
  pids+=($!)
done
JAX_PROCESS_ID=0 "${cli[@]}" "$cmd" --config "$config" "$@" &
pids=("$!" "${pids[@]}")

status=0
for pid in "${pids[@]}"; do
  if ! wait "$pid"; then
    status=1
    cleanup  # one failed: the others would wait on it forever
  fi
done
exit $status
