#!/usr/bin/env bash
# SAGC vs static G at equal wall-clock on the straggling `ramble` task (issue 17): static
# G in {4, 8, 16} and SAGC, 5 seeds, every run read up to the same budget of *modelled
# accelerator rollout seconds* (`--clock model`; the real CPU clock is reported beside it).
#
#   launch/compare_straggle.sh [-o OUT_DIR] [ARGS ...]
#
#   -o OUT_DIR  output directory (default runs/compare_straggle); rerunning resumes
#   ARGS        passed on to `sagc-jax compare` after the defaults below, e.g. --seeds 0,1,2,3,4,
#               --clock measured, --budget-s 60, init.params=DIR (one shared SFT warm start)
#
# Defaults: --seeds 0,1,2,3,4 --budget-s auto (the smallest run total) --clock model and per-policy
# step caps sized so every policy passes the budget (static-16 spends the modelled clock
# fastest: each of its batches usually waits for a looping member).
# Writes OUT_DIR/results.md, results.json, *.png (length_distribution.png: early vs late
# completion lengths) and OUT_DIR/compare.log. Env: as launch/compare.sh.
set -euo pipefail
out=runs/compare_straggle
if [[ ${1:-} == -h || ${1:-} == --help ]]; then sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0; fi
if [[ ${1:-} == -o ]]; then out=${2:?-o needs a directory}; shift 2; fi
exec "$(dirname "${BASH_SOURCE[0]}")/compare.sh" -c configs/compare_straggle_cpu.yaml -o "$out" \
  --seeds 0,1,2,3,4 --policies static-4,static-8,static-16,sagc --budget-s auto --clock model \
  --max-steps static-4=64,static-8=56,static-16=52,sagc=60 "$@"
