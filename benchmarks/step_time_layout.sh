#!/usr/bin/env bash
# Issue 52's "step time no worse, measured interleaved": the main job (configs/tiny_cpu.yaml,
# first 20 GRPO steps, no evals) at the commit before the one-train-batch refactor and at
# another commit, run alternately (old, new, old, new, ...) on this machine.
#   bash benchmarks/step_time_layout.sh [OLD=c3fd7f0] [NEW=HEAD] [PAIRS=3]
# Raw files: benchmarks/results/step_time_layout/<label>-<i>/metrics.jsonl (+ load.txt);
# the table: python benchmarks/step_time_layout.py benchmarks/results/step_time_layout
# Needs a quiet machine: nothing else running (the load average is recorded beside each run).
set -euo pipefail
OLD=${1:-c3fd7f0}
NEW=${2:-HEAD}
PAIRS=${3:-3}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=$ROOT/benchmarks/results/step_time_layout
PY=${PY:-python}
TMP=$(mktemp -d)
trap 'git -C "$ROOT" worktree remove --force "$TMP/old" 2>/dev/null || true;
      git -C "$ROOT" worktree remove --force "$TMP/new" 2>/dev/null || true; rm -rf "$TMP"' EXIT
git -C "$ROOT" worktree add --detach "$TMP/old" "$OLD" >/dev/null
git -C "$ROOT" worktree add --detach "$TMP/new" "$NEW" >/dev/null
mkdir -p "$OUT"
for i in $(seq 0 $((PAIRS - 1))); do
  for label in old new; do
    tree=$TMP/$label
    dest=$OUT/$label-$i
    rm -rf "$dest" && mkdir -p "$dest"
    (cd "$tree" && git rev-parse --short HEAD > "$dest/commit.txt")
    cat /proc/loadavg > "$dest/load.txt"
    # PYTHONPATH first: the checkout under test, not an editable install elsewhere.
    (cd "$tree" && PYTHONPATH=$tree $PY -m sagc_jax.cli train --config configs/tiny_cpu.yaml \
        run.steps=20 run.eval_every=0 run.progress=false run.plots=false \
        run.dir="$TMP/run-$label-$i" > "$dest/train.log" 2>&1)
    cat /proc/loadavg >> "$dest/load.txt"
    cp "$TMP/run-$label-$i/metrics.jsonl" "$dest/"
    echo "$label-$i done: $(tail -1 "$dest/load.txt")"
  done
done
