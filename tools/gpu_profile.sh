#!/usr/bin/env bash
# The second GPU call (issue 54): where the packed update's and decode's device time goes
# (gpu_profile.py: one traced call of each), and decode at G = 16 under XLA flag variants that
# move the decode loop's launches onto the device (CUDA graphs of the loop, an unrolled scan).
#
#   bash tools/gpu_profile.sh [OUT_DIR]          # OUT_DIR default: $OUT, else bench_out/
# Wheels as in gpu.sh (.gpu_wheels). Each variant is its own process with its own timeout:
# an unknown flag or a crash costs only its own line. DEADLINE [300 s] bounds the whole call.
set -uo pipefail
out_dir=${1:-${OUT:-bench_out}}
mkdir -p "$out_dir"
out_dir=$(cd "$out_dir" && pwd)
cd "$(dirname "$0")/.."
log=$out_dir/gpu_profile.log
py=${PYTHON:-python3}
start=$SECONDS
deadline=${DEADLINE:-300}
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false XLA_PYTHON_CLIENT_MEM_FRACTION=0.9
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
say() { echo "[gpu_profile.sh $((SECONDS - start))s] $*" | tee -a "$log"; }
: >"$log"
if compgen -G ".gpu_wheels/*.whl" >/dev/null; then
  site=${TMPDIR:-/tmp}/sagc_gpu_site
  rm -rf "$site" && mkdir -p "$site"
  "$py" -m pip install -q --no-index --no-deps --target "$site" .gpu_wheels/*.whl >>"$log" 2>&1
  export PYTHONPATH="$site:$PYTHONPATH"
fi
left() { echo $((deadline - (SECONDS - start))); }
say "trace: start"
timeout --kill-after=5 "$(( $(left) < 150 ? $(left) : 150 ))" "$py" -m tools.gpu_profile \
  --out "$out_dir/profile.json" 2>&1 | tee -a "$log"
# name|XLA_FLAGS: decode at G = 16 under each (the baseline is gpu.sh's decode.json).
variants=(
  "cmdbuf_while|--xla_gpu_enable_command_buffer=+WHILE,+CONDITIONAL --xla_gpu_graph_min_graph_size=1"
  "unroll_full|--xla_gpu_enable_while_loop_unrolling=WHILE_LOOP_UNROLLING_FULL_UNROLL"
  "no_cmdbuf|--xla_gpu_enable_command_buffer="
)
for v in "${variants[@]}"; do
  name=${v%%|*}
  t=$(left)
  ((t < 30)) && { say "$name: skipped, ${t}s left"; continue; }
  ((t > 60)) && t=60
  say "$name: start (timeout ${t}s)"
  XLA_FLAGS="${v#*|}" timeout --kill-after=5 "$t" "$py" -m tools.gpu_bench decode \
    --decode-groups 16 --out "$out_dir/decode_$name.json" 2>&1 | tail -3 | tee -a "$log"
done
say "done: $(cd "$out_dir" && ls -- *.json | tr '\n' ' ')"
