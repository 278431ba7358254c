#!/usr/bin/env bash
# SAGC vs static group sizes on this machine's CPU: `sagc-jax compare` with a persistent compile
# cache, one CPU device per process, and a log next to the results.
#
#   launch/compare.sh [-c CONFIG] [-o OUT_DIR] [ARGS ...]
#
#   -c CONFIG   base config (default configs/compare_cpu.yaml)
#   -o OUT_DIR  output directory (default runs/compare); rerunning the same command resumes:
#               finished runs are skipped, a partial one continues from its checkpoint
#   ARGS        passed on to `sagc-jax compare`, e.g. --seeds 0,1
#               --policies static-4,static-8,static-16,sagc --target 0.5 run.steps=60
#
# Writes OUT_DIR/results.md, results.json, *.png and OUT_DIR/compare.log.
# Env: SAGC_JAX (the CLI; default `sagc-jax`, falling back to `python -m sagc_jax.cli`),
#      JAX_COMPILATION_CACHE_DIR (default ~/.cache/sagc-jax/jax), CPU_DEVICES (default 1).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"

config=configs/compare_cpu.yaml
out=runs/compare
usage() { sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; }
while [[ $# -gt 0 ]]; do  # leading -c/-o/-h; everything from the first other word is passed on
  case "$1" in
    -c) config=${2:?-c needs a config path}; shift 2 ;;
    -o) out=${2:?-o needs a directory}; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) break ;;
  esac
done
require_config compare.sh "$config"

resolve_cli

export JAX_PLATFORMS=cpu
# One device: a 2-core machine gains nothing from fake devices, and XLA already uses both cores.
export XLA_FLAGS="--xla_force_host_platform_device_count=${CPU_DEVICES:-1} ${XLA_FLAGS:-}"
# Persistent compile cache: every run compiles the same shapes, so runs after the first (and
# reruns) load them from disk instead of recompiling (~60 s per run cold).
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-$HOME/.cache/sagc-jax/jax}
export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=${JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS:-0}
export TOKENIZERS_PARALLELISM=false
export PYTHONUNBUFFERED=1

mkdir -p "$out"
echo "compare.sh: ${cli[*]} compare --config $config --out-dir $out $*" | tee -a "$out/compare.log"
"${cli[@]}" compare --config "$config" --out-dir "$out" "$@" 2>&1 | tee -a "$out/compare.log"
exit "${PIPESTATUS[0]}"
