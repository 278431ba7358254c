#!/usr/bin/env bash
# Issue 49's real-model experiment: static G in {4, 8, 16} and SAGC with the shipped defaults,
# one run per clock it decides on (sagc-model, sagc-measured), on SmolLM2-135M-Instruct,
# two reasoning-gym task mixes, seeds 0-2, 48 GRPO steps, a checkpoint every 8 steps (all kept:
# `sagc-jax compare --curves` evaluates each one for held-out accuracy against seconds).
#
#   bash benchmarks/sagc_real.sh            # train (resumes: finished runs are skipped, a partial
#                                        # one continues from its newest checkpoint)
#   COLLECT=1 bash benchmarks/sagc_real.sh  # copy finished runs' raw files to docs/results/sagc_real/
#                                        # (the training loop also does it after every run)
#   EXTRA="sagc.time_model.decode_a=..." DEST=docs/results/sagc_real_cpuclock OUT=runs/sagc49cpu \
#     POLICIES=sagc-model bash benchmarks/sagc_real.sh   # a cell on another clock: overrides
#                                        # added to every run, collected into DEST/<mix>/
#
# Hours of CPU per mix (about 20-60 min a run on 2 cores, more under load); run at `nice` so a
# shared machine stays usable: the `model` clock does not depend on the load, and every step
# logs the 1-minute load average (`load_1m`) beside its measured seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
# MODEL / STEPS / EVERY: another model, run length and checkpoint spacing (the main job's
# cell: MODEL= MIXES=arith=configs/tiny_cpu.yaml STEPS=150 EVERY=25, its own built model).
if [[ -z ${MODEL+x} ]]; then
  MODEL=model.path=$(python -c "from sagc_jax.models.gguf import smollm2_path; print(smollm2_path())")
fi
STEPS=${STEPS:-48}
OUT=${OUT:-runs/sagc49}
MIXES=${MIXES:-"arith1=configs/smollm2-135m_rg_cpu.yaml arith2=configs/smollm2-135m_rg-2digit_cpu.yaml"}
POLICIES=${POLICIES:-static-4,static-8,static-16,sagc-model,sagc-measured}
SEEDS=${SEEDS:-0,1,2}
DEST=${DEST:-docs/results/sagc_real}
# shellcheck disable=SC2206  # MODEL, EXTRA: space-separated key=value overrides
common=(${MODEL} run.steps="$STEPS" checkpoint.every="${EVERY:-8}" checkpoint.keep=7
        run.progress=false ${EXTRA:-})

collect() {  # collect RUN_DIR DEST: a finished run's raw files (evals included) into the repo
  local run=$1 dest=$2
  [[ -d $run/checkpoints/$STEPS ]] || return 0
  mkdir -p "$dest"
  for f in config.yaml sagc_constants.json metrics.jsonl trace.jsonl eval.json compare_timing.json; do
    [[ -f $run/$f ]] && cp "$run/$f" "$dest/"
  done
  echo "collected $dest"
}

for mix in $MIXES; do
  name=${mix%%=*} cfg=${mix#*=}
  if [[ ${COLLECT:-0} == 1 ]]; then
    for run in "$OUT/$name"/*-s*; do
      collect "$run" "$DEST/$name/$(basename "$run")"
    done
    continue
  fi
  # One run at a time, each evaluated at every checkpoint (--curves) and collected as soon as
  # it is done: a session that stops mid-way loses at most the run in progress.
  for seed in ${SEEDS//,/ }; do
    for pol in ${POLICIES//,/ }; do
      nice -n "${NICE:-19}" sagc-jax compare --config "$cfg" --out-dir "$OUT/$name" \
        --seeds "$seed" --policies "$pol" --curves "${common[@]}"
      collect "$OUT/$name/$pol-s$seed" "$DEST/$name/$pol-s$seed"
    done
  done
  nice -n "${NICE:-19}" sagc-jax compare --config "$cfg" --out-dir "$OUT/$name" --seeds "$SEEDS" \
    --policies "$POLICIES" --summarize-only --curves "${common[@]}"
done
