#!/usr/bin/env bash
# Issue 49's real runs still to do, as one queue a session can pick up on any machine (a
# session's machine may be fresh: runs/ and its checkpoints gone). Each line below is one run
# of benchmarks/sagc_real.sh; a run whose raw files are already committed (DEST/<mix>/<run>/
# eval.json) is skipped, so the queue needs no editing as runs land — only new lines.
#
#   bash benchmarks/sagc_real_queue.sh 0 2 &   # lane 0 of 2: lines 0, 2, 4, ... not yet done
#   bash benchmarks/sagc_real_queue.sh 1 2 &   # lane 1 of 2: lines 1, 3, 5, ...
#   bash benchmarks/sagc_real_queue.sh --list  # what is left, one run a line
#
# Two lanes on this 2-core machine (about 1-2 h a run there, evaluations included); more
# lanes on a bigger one. Each finished run is copied into docs/results/ by sagc_real.sh:
# commit it, with its page section, as it lands.
set -euo pipefail
cd "$(dirname "$0")/.."
CPU="sagc.time_model.decode_a=0.0558904 sagc.time_model.decode_b=0.00253875"
CPU+=" sagc.time_model.prefill_a=0.36022 sagc.time_model.prefill_b=0.00178673"
A1=arith1=configs/smollm2-135m_rg_cpu.yaml
A2=arith2=configs/smollm2-135m_rg-2digit_cpu.yaml
# DEST | mix | policy | seed | OUT | EXTRA  (priority order: what decides the benefit model
# first, any_group's missing seeds and their statics; done lines stay, as the record)
QUEUE=(
  "docs/results/sagc_real_any|$A1|sagc-model|1|runs/sagc49_any|sagc.benefit=any_group"
  "docs/results/sagc_real_any|$A1|sagc-model|2|runs/sagc49_any|sagc.benefit=any_group"
  "docs/results/sagc_real_any|$A2|sagc-model|1|runs/sagc49_any|sagc.benefit=any_group"
  "docs/results/sagc_real_any|$A2|sagc-model|2|runs/sagc49_any|sagc.benefit=any_group"
  "docs/results/sagc_real|$A1|static-16|2|runs/sagc49|"
  "docs/results/sagc_real|$A2|static-8|1|runs/sagc49|"
  "docs/results/sagc_real|$A2|static-8|2|runs/sagc49|"
  "docs/results/sagc_real|$A2|static-4|2|runs/sagc49|"
  "docs/results/sagc_real_cpuclock_prior|$A1|sagc-model|1|runs/sagc49cpu_prior|$CPU sagc.initial_group_size=8 sagc.benefit=groups"
  "docs/results/sagc_real_cpuclock_prior|$A1|sagc-model|2|runs/sagc49cpu_prior|$CPU sagc.initial_group_size=8 sagc.benefit=groups"
  "docs/results/sagc_real_cpuclock_any_init4|$A1|sagc-model|2|runs/sagc49cpu_any_init4|$CPU sagc.benefit=any_group sagc.initial_group_size=4"
  "docs/results/sagc_real_any|$A1|sagc-model|0|runs/sagc49_any|sagc.benefit=any_group"
  "docs/results/sagc_real|$A1|sagc-model|2|runs/sagc49|sagc.benefit=groups"
)

done_run() {  # done_run DEST MIX POLICY SEED: its raw files, evaluations included, are in the repo
  [[ -f $1/${2%%=*}/$3-s$4/eval.json ]]
}

if [[ ${1:-} == --list ]]; then
  for i in "${!QUEUE[@]}"; do
    IFS='|' read -r dest mix pol seed out extra <<< "${QUEUE[$i]}"
    done_run "$dest" "$mix" "$pol" "$seed" || echo "$i $dest ${mix%%=*} $pol-s$seed ${extra:+($extra)}"
  done
  exit 0
fi
lane=${1:?usage: sagc_real_queue.sh LANE LANES | --list} lanes=${2:?usage: sagc_real_queue.sh LANE LANES}
for i in "${!QUEUE[@]}"; do
  (( i % lanes == lane )) || continue
  IFS='|' read -r dest mix pol seed out extra <<< "${QUEUE[$i]}"
  done_run "$dest" "$mix" "$pol" "$seed" && continue
  echo "=== $(date -u +%FT%TZ) queue line $i: ${mix%%=*} $pol-s$seed -> $dest"
  EXTRA=$extra MIXES=$mix POLICIES=$pol SEEDS=$seed DEST=$dest OUT=$out bash benchmarks/sagc_real.sh
done
