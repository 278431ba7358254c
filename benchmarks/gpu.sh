#!/usr/bin/env bash
# One prepared GPU benchmark (<= 8 minutes on one H100/H200): train-step MFU and decode
# tokens/s vs the HBM roofline for a Qwen2-0.5B-shaped random bf16 model, then a short SAGC
# training run. See benchmarks/gpu_bench.py for what is measured and how.
#
#   benchmarks/gpu.sh [OUT_DIR]        # OUT_DIR default: $OUT, else bench_out/
#   SMOKE=1 benchmarks/gpu.sh          # tiny shapes on any machine (what CI runs, on a CPU)
#
# Writes OUT_DIR/gpu_bench.json (all numbers), gpu_bench.log and nvidia-smi.txt.
# Env: XLA_PYTHON_CLIENT_MEM_FRACTION [0.9], JAX_COMPILATION_CACHE_DIR [OUT_DIR/jax_cache],
#      BENCH_TIMEOUT [480 s], PYTHON [python], BENCH_ARGS (extra gpu_bench.py flags, e.g.
#      "--peak-tflops 989 --hbm-tbps 4.8" for a device kind the script does not know).
set -euo pipefail

cd "$(dirname "$0")/.."
out_dir=${1:-${OUT:-bench_out}}
mkdir -p "$out_dir"
export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.9}
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-$out_dir/jax_cache}
export TOKENIZERS_PARALLELISM=false
export PYTHONUNBUFFERED=1
py=${PYTHON:-python}
read -r -a extra <<<"${BENCH_ARGS:-}"
if [[ ${SMOKE:-0} == 1 ]]; then
  extra+=(--smoke)
fi

{ nvidia-smi || echo "no nvidia-smi"; } >"$out_dir/nvidia-smi.txt" 2>&1
"$py" -c "import jax; print('jax', jax.__version__, jax.devices())" 2>&1 | tee "$out_dir/gpu_bench.log"
timeout "${BENCH_TIMEOUT:-480}" "$py" benchmarks/gpu_bench.py --out "$out_dir/gpu_bench.json" \
  "${extra[@]}" 2>&1 | tee -a "$out_dir/gpu_bench.log"
