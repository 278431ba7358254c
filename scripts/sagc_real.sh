#!/usr/bin/env bash
# Issue 49's real-model experiment: static G in {4, 8, 16} (later SAGC) on SmolLM2-135M-Instruct,
# two reasoning-gym task mixes, seeds 0-2, 48 GRPO steps, a checkpoint every 8 steps (all kept:
# `sagc-jax compare --curves` evaluates each one for held-out accuracy against seconds).
#
#   bash scripts/sagc_real.sh            # train (resumes: finished runs are skipped, a partial
#                                        # one continues from its newest checkpoint)
#   COLLECT=1 bash scripts/sagc_real.sh  # copy finished runs' raw files to docs/results/sagc_real/
#
# Hours of CPU per mix (about 20-60 min a run on 2 cores, more under load); run at `nice` so a
# shared machine stays usable: the `model` clock does not depend on the load, and every step
# logs the 1-minute load average (`load_1m`) beside its measured seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
GGUF=${GGUF:-$(python -c "from sagc_jax.models.gguf import smollm2_path; print(smollm2_path())")}
OUT=${OUT:-runs/sagc49}
MIXES=${MIXES:-"arith1=configs/smollm2-135m_rg_cpu.yaml arith2=configs/smollm2-135m_rg-2digit_cpu.yaml"}
POLICIES=${POLICIES:-static-4,static-8,static-16}
SEEDS=${SEEDS:-0,1,2}
common=(model.path="$GGUF" run.steps=48 checkpoint.every=8 checkpoint.keep=7 run.progress=false)

for mix in $MIXES; do
  name=${mix%%=*} cfg=${mix#*=}
  if [[ ${COLLECT:-0} == 1 ]]; then
    for run in "$OUT/$name"/*-s*; do
      [[ -d $run/checkpoints/48 ]] || continue  # finished runs only
      dest=docs/results/sagc_real/$name/$(basename "$run")
      mkdir -p "$dest"
      for f in config.yaml metrics.jsonl trace.jsonl eval.json compare_timing.json; do
        [[ -f $run/$f ]] && cp "$run/$f" "$dest/"
      done
      echo "collected $dest"
    done
    continue
  fi
  nice -n "${NICE:-19}" sagc-jax compare --config "$cfg" --out-dir "$OUT/$name" --seeds "$SEEDS" \
    --policies "$POLICIES" "${common[@]}"
done
