#!/usr/bin/env bash
# The prepared GPU call (issue 35): on one H100/H200-class GPU in <= 8 minutes, the packed GRPO
# train step's MFU, decode vs the HBM roofline at 16/64/256 rows, the SAGC time model fitted to
# it with the simulator suite rerun on it, and a short SAGC run on real timings.
#
#   bash tools/gpu.sh [--cpu-smoke] [OUT_DIR]     # OUT_DIR default: $OUT, else bench_out/
#
# Steps (each part is its own python3 process with its own timeout, writing OUT_DIR/PART.json
# as soon as it has a result; everything printed also goes to OUT_DIR/gpu_bench.log):
#   wheels  .gpu_wheels/*.whl (tools/prepare_gpu_wheels.sh) -> pip install --no-index
#           --no-deps --target $GPU_SITE (outside OUT_DIR), put first on PYTHONPATH
#   env     env.json: versions, device, peaks, import of every sagc_jax module; a device with
#           unknown peaks (and no PEAKS) stops the call here, after seconds
#   train   train.json      decode  decode.json      timing  timing.json      sagc  sagc.json
# --cpu-smoke: JAX_PLATFORMS=cpu, tiny shapes, nominal peaks; the same parts and files (CI:
# tests/test_gpu_smoke.py). Wheels are then installed only when GPU_WHEELS is set.
#
# Env (defaults in brackets):
#   PYTHON [python3]   GPU_WHEELS [.gpu_wheels]   GPU_SITE [${TMPDIR:-/tmp}/sagc_gpu_site]
#   PEAKS  [none; smoke: "--peak-tflops 1 --peak-hbm-gbs 100"]  e.g. "--peak-tflops 989
#          --peak-hbm-gbs 4800" for a device the bench does not know (it refuses otherwise)
#   DEADLINE [480 s]  every part's timeout is cut to what is left of it
#   JAX_COMPILATION_CACHE_DIR [${TMPDIR:-/tmp}/sagc_jax_cache]  (never under OUT_DIR: only a
#          few files come back from the device machine)
#   XLA_PYTHON_CLIENT_MEM_FRACTION [0.9]   BENCH_ARGS (extra flags for every part)
set -euo pipefail

smoke=0
if [[ ${1:-} == --cpu-smoke ]]; then
  smoke=1
  shift
fi
out_dir=${1:-${OUT:-bench_out}}
mkdir -p "$out_dir"
out_dir=$(cd "$out_dir" && pwd)  # the caller's relative path, before the cd below
cd "$(dirname "$0")/.."
log=$out_dir/gpu_bench.log
py=${PYTHON:-python3}
tmp=${TMPDIR:-/tmp}
start=$SECONDS
deadline=${DEADLINE:-480}

export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.9}
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-$tmp/sagc_jax_cache}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
read -r -a args <<<"${BENCH_ARGS:-}"
if [[ $smoke == 1 ]]; then
  export JAX_PLATFORMS=cpu
  # Least LLVM effort: the smoke's cost is XLA:CPU compiling (about half of it without these).
  fast="--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
  export XLA_FLAGS="${XLA_FLAGS:-} $fast"
  args+=(--cpu-smoke)
  read -r -a peaks <<<"${PEAKS:---peak-tflops 1 --peak-hbm-gbs 100}"
else
  read -r -a peaks <<<"${PEAKS:-}"
fi

say() { echo "[gpu.sh $((SECONDS - start))s] $*" | tee -a "$log"; }
: >"$log"

# ---- wheels: what the image lacks, installed outside OUT_DIR
wheels=${GPU_WHEELS:-.gpu_wheels}
if [[ $smoke == 1 && -z ${GPU_WHEELS:-} ]]; then
  say "smoke: no GPU_WHEELS given, using this environment's packages"
elif compgen -G "$wheels/*.whl" >/dev/null; then
  export GPU_SITE=${GPU_SITE:-$tmp/sagc_gpu_site}
  rm -rf "$GPU_SITE"
  mkdir -p "$GPU_SITE"
  if ! "$py" -m pip install --quiet --no-index --no-deps --target "$GPU_SITE" \
    "$wheels"/*.whl >>"$log" 2>&1; then
    # No pip (or a pip that refuses): a wheel is a zip of its site-packages files.
    say "pip install --target failed (see above); unpacking the wheels instead"
    for w in "$wheels"/*.whl; do "$py" -m zipfile -e "$w" "$GPU_SITE"; done
  fi
  export PYTHONPATH="$GPU_SITE:$PYTHONPATH"
  say "installed $(find "$wheels" -maxdepth 1 -name '*.whl' | wc -l) wheels into $GPU_SITE"
else
  say "warning: no wheels in $wheels (tools/prepare_gpu_wheels.sh makes them)"
fi

# run_part PART BUDGET_S [EXTRA ARGS]: the part under `timeout`, cut to the deadline.
run_part() {
  local part=$1 budget=$2
  shift 2
  local left=$((deadline - (SECONDS - start)))
  ((budget > left)) && budget=$left
  if ((budget < 15)); then
    say "$part: skipped, ${left}s left of the ${deadline}s deadline"
    return 1
  fi
  say "$part: start (timeout ${budget}s)"
  local rc=0
  timeout --kill-after=10 "$budget" "$py" -m tools.gpu_bench "$part" \
    --out "$out_dir/$part.json" "${peaks[@]}" "${args[@]}" "$@" 2>&1 | tee -a "$log" || rc=$?
  say "$part: exit $rc"
  return "$rc"
}

{ command -v nvidia-smi >/dev/null && nvidia-smi -L; } 2>&1 | tee -a "$log" || true
if ! run_part env 90; then
  say "env failed: stopping (see $log)"
  exit 2
fi
status=0
run_part train 170 || status=1
run_part decode 170 || status=1
if [[ -f $out_dir/decode.json ]]; then
  run_part timing 80 || status=1
fi
run_part sagc 150 || status=1
say "done: $(cd "$out_dir" && ls -- *.json | tr '\n' ' ')"
exit "$status"
