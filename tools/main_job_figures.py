"""The main job's figures (README "Results", docs/results/tiny_cpu.md) from one run's raw files.

    python -m tools.main_job_figures docs/results/tiny_cpu
    python -m tools.main_job_figures docs/results/gemma3 --untrained \
        docs/results/gemma3/eval_untrained.json --lengths \
        --paired docs/results/gemma3/eval_paired_initial.json \
        docs/results/gemma3/eval_paired_48.json                # the Gemma 3 270M run

reads `<dir>/metrics.jsonl` and `<dir>/eval_initial.json` (what `sagc-jax train --config
configs/tiny_cpu.yaml` writes in its run dir; the committed copies sit in docs/results/tiny_cpu)
and prints the page's table: the training reward (mean of the first and of the last 10 steps),
held-out greedy accuracy before GRPO and at the last step (and its range over the periodic
evals), compiles after warm-up, the group sizes SAGC chose, the straggler rate and the packed
train step's token utilisation.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path
from typing import Any

from scipy.stats import binomtest


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _path(sizes: list[int]) -> str:
    """The distinct group sizes in the order first chosen: 8 -> 12 -> 16."""
    seen: list[int] = []
    for g in sizes:
        if g not in seen:
            seen.append(g)
    return " → ".join(map(str, seen))


def _length_rows(rows: list[dict[str, Any]]) -> list[str]:
    """Mean completion length and the share at the cap, first and last 10 steps."""
    def m(key: str, part: list[dict[str, Any]]) -> float:
        return sum(r[key] for r in part) / len(part)
    first, last = rows[:10], rows[-10:]
    return [f"| mean completion length, tokens (10-step mean) | {m('len_mean', first):.1f} "
            f"| {m('len_mean', last):.1f} |",
            f"| completions at the length cap (10-step mean) | {m('truncated_frac', first):.3f} "
            f"| {m('truncated_frac', last):.3f} |"]


def paired_row(before: Path, after: Path) -> str:
    """The problems whose greedy answer changed between two `sagc-jax eval --out` JSONs of the
    same problems (per_prompt, in the same order), with the two-sided sign (binomial) test's p
    of as uneven a split under "no change in accuracy"."""
    a, b = (json.loads(p.read_text())["per_prompt"] for p in (before, after))
    if [x["prompt"] for x in a] != [x["prompt"] for x in b]:
        raise ValueError(f"{before} and {after} hold different problems")
    up = sum(not x["greedy_correct"] and y["greedy_correct"] for x, y in zip(a, b))
    down = sum(x["greedy_correct"] and not y["greedy_correct"] for x, y in zip(a, b))
    p = binomtest(up, up + down).pvalue if up + down else 1.0
    return (f"| problems whose greedy answer changed (same {len(a)}, paired) | – | "
            f"**{up}** wrong → right, {down} right → wrong (sign test p = {p:.3f}) |")


def figures(run_dir: Path, untrained: Path | None = None, lengths: bool = False,
            paired: tuple[Path, Path] | None = None) -> str:
    """The page's table; `untrained`: an eval JSON (`sagc-jax eval --out`, or a run's
    `eval_initial.json`) of the model before any training, shown as its own row; `lengths`:
    rows for completion length and cap hits; `paired`: two per-prompt eval JSONs (before,
    after) for `paired_row`."""
    rows = _jsonl(run_dir / "metrics.jsonl")
    before = json.loads((run_dir / "eval_initial.json").read_text())["eval_accuracy"]
    evals = [r["eval_accuracy"] for r in rows if "eval_accuracy" in r]
    reward = [r["reward_mean"] for r in rows]
    sizes = [r["group_size"] for r in rows]
    counts = Counter(sizes)
    n = len(rows)
    util = [r["train_token_util"] for r in rows if "train_token_util" in r]
    strag = [r["straggler_rate"] for r in rows]
    share = ", ".join(f"{v} at {g}" for g, v in sorted(counts.items(), key=lambda kv: -kv[1]))
    head = [f"| | before GRPO | after {n} GRPO steps |", "|---|---|---|"]
    if untrained is not None:
        raw = json.loads(untrained.read_text())
        acc = raw.get("eval_accuracy", raw.get("accuracy"))
        head.append(f"| held-out greedy accuracy of the untrained model | {acc:.3f} | – |")
    return "\n".join([
        *head,
        f"| training reward (10-step mean of sampled completions) | {sum(reward[:10]) / 10:.2f} "
        f"| **{sum(reward[-10:]) / 10:.2f}** |",
        f"| held-out greedy accuracy | {before:.3f} | **{evals[-1]:.3f}** "
        f"({min(evals):.3f}–{max(evals):.3f} at the {len(evals)} evals) |",
        f"| compiles after warm-up | – | **{sum(r.get('compiles', 0) for r in rows)}** over all "
        f"{n} steps |",
        f"| G chosen by SAGC | – | {_path(sizes)} ({share}) |",
        f"| straggler rate (mean of the steps) | – | {sum(strag) / n:.3f} |",
        f"| train-step token utilisation (`train_token_util`, packed) | – | "
        f"{sum(util) / max(len(util), 1):.2f} |",
        *(_length_rows(rows) if lengths else []),
        *([paired_row(*paired)] if paired else []),
    ])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run_dir", type=Path)
    p.add_argument("--untrained", type=Path, help="eval JSON of the model before any training")
    p.add_argument("--lengths", action="store_true", help="add completion-length rows")
    p.add_argument("--paired", type=Path, nargs=2, metavar=("BEFORE", "AFTER"),
                   help="two `sagc-jax eval --out` JSONs of the same problems")
    a = p.parse_args()
    print(figures(a.run_dir, a.untrained, a.lengths, a.paired))


if __name__ == "__main__":
    main()
