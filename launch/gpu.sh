#!/usr/bin/env bash
# Train on the NVIDIA GPU(s) of ONE machine: a single process drives every visible GPU, and
# `mesh.data: -1` spreads the batch over them (plain data parallel; set mesh.fsdp to shard the
# params too). No jax.distributed needed on one host.
#
# Needs a CUDA build of jax (the package's default is the CPU one):
#   pip install -e '.[cuda]'     # = jax[cuda13]; '.[cuda12]' on a driver too old for CUDA 13
# then runs the installed `sagc-jax train` (else `$PYTHON -m sagc_jax.cli` from the repo).
#
#   launch/gpu.sh CONFIG [ARGS ...]
#
#   CONFIG   e.g. configs/qwen2.5-0.5b_gsm8k_gpu.yaml
#   ARGS     --dry-run and/or key=value overrides (model.path=..., data.train_file=...)
#
# Examples:
#   launch/gpu.sh configs/qwen2.5-0.5b_gsm8k_gpu.yaml model.path=$M model.tokenizer=$M \
#       data.train_file=$D/train.jsonl data.eval_file=$D/test.jsonl
#   CUDA_VISIBLE_DEVICES=0,1 launch/gpu.sh configs/qwen2.5-0.5b_gsm8k_gpu.yaml mesh.data=2 ...
#   DRY_RUN=1 launch/gpu.sh configs/qwen2.5-0.5b_gsm8k_gpu.yaml model.path=$M  # sizes only
#
# Env (defaults in brackets):
#   XLA_PYTHON_CLIENT_MEM_FRACTION [0.92]  share of each GPU's memory JAX preallocates; lower
#                                          it if something else shares the GPU
#   XLA_PYTHON_CLIENT_PREALLOCATE  [true]  false = grow on demand (slower, fragments)
#   JAX_COMPILATION_CACHE_DIR      [~/.cache/sagc-jax/jax]  persistent compile cache: a restart
#                                          skips the start-up compiles of the shape set
#   XLA_FLAGS                      [unset] passed through (e.g. --xla_dump_to=/tmp/dump)
#   DRY_RUN                        [0]     1 = $PYTHON -m sagc_jax.dryrun on this machine's GPUs
#   PYTHON                         [python3]  the interpreter of the dry run / module fallback
#   SAGC_JAX                       [sagc-jax]  the CLI to run
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"

if [[ $# -lt 1 || $1 == -h || $1 == --help ]]; then
  sed -n '2,/^set -euo/{/^#/p}' "$0" | sed 's/^# \{0,1\}//'
  [[ $# -lt 1 ]] && exit 2 || exit 0
fi
config=$1
shift
require_config gpu.sh "$config"

export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.92}
export XLA_PYTHON_CLIENT_PREALLOCATE=${XLA_PYTHON_CLIENT_PREALLOCATE:-true}
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-$HOME/.cache/sagc-jax/jax}
export TOKENIZERS_PARALLELISM=false
unset JAX_PLATFORMS  # let JAX pick CUDA

if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader >&2 || true
else
  echo "gpu.sh: warning: nvidia-smi not found; JAX may fall back to the CPU" >&2
fi

if [[ ${DRY_RUN:-0} == 1 ]]; then
  exec "${PYTHON:-python3}" -m sagc_jax.dryrun --config "$config" "$@"
fi
resolve_cli
exec "${cli[@]}" train --config "$config" "$@"
