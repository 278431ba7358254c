"""The tool jobs' figures (docs/results/tiny_cpu_tool.md, smollm2_tool.md, README "Results").

    python -m tools.tool_job_figures docs/results/tiny_cpu_tool
    python -m tools.tool_job_figures docs/results/smollm2_tool --block 6

reads `<dir>/metrics.jsonl` (what `sagc-jax train --config configs/tiny_cpu_tool.yaml` writes),
`<dir>/train.log` (its output: the held-out accuracy before GRPO) and the two single-turn evals
`<dir>/eval_no_tool_sft.json` / `eval_no_tool_step150.json` (`sagc-jax eval --out`), and prints
the page's tables: turns per episode, environment-token share, reward and episode length per
`--block` steps; held-out accuracy with and without the calculator; compiles after warm-up.
With `<dir>/untrained.log` (the same config's output with `init.sft_steps=0`, so its accuracy
before GRPO is the untrained model's with the calculator) the table gets an "untrained" row.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _mean(rows: list[dict[str, Any]], key: str) -> float:
    return sum(r[key] for r in rows) / len(rows)


def _before_grpo(log: Path) -> float:
    """The held-out accuracy a train log reports before GRPO (nan if it has none)."""
    m = re.search(r"accuracy before GRPO: ([0-9.]+)", log.read_text())
    return float(m.group(1)) if m else float("nan")


def figures(run: Path, block: int = 25) -> str:
    """The page's tables as markdown."""
    rows = _jsonl(run / "metrics.jsonl")
    out = ["| steps | turns / episode | env tokens / episode tokens | train reward | "
           "mean episode tokens |", "|---|---|---|---|---|"]
    for lo in range(0, len(rows), block):
        part = rows[lo:lo + block]
        out.append(f"| {part[0]['step']}-{part[-1]['step']} | {_mean(part, 'episode_turns'):.2f} "
                   f"| {_mean(part, 'env_token_frac'):.3f} | {_mean(part, 'reward_mean'):.3f} "
                   f"| {_mean(part, 'len_mean'):.1f} |")
    first, last = rows[:10], rows[-10:]
    out.append(f"\nsteps 1-10 / last 10: turns {_mean(first, 'episode_turns'):.2f} -> "
               f"{_mean(last, 'episode_turns'):.2f}, reward {_mean(first, 'reward_mean'):.2f} -> "
               f"{_mean(last, 'reward_mean'):.2f}")
    before = _before_grpo(run / "train.log")
    evals = [(r["step"], r["eval_accuracy"]) for r in rows if "eval_accuracy" in r]
    last = rows[-1]["step"]
    no_tool = {name: json.loads((run / f"eval_no_tool_{name}.json").read_text())["accuracy"]
               for name in ("sft", f"step{last}")}
    out += ["", "| checkpoint | with the calculator (episodes) | without it (single turn) |",
            "|---|---|---|"]
    if (run / "untrained.log").exists():
        out.append(f"| untrained | {_before_grpo(run / 'untrained.log'):.3f} | – |")
    out += [f"| SFT warm start | {before:.3f} | {no_tool['sft']:.3f} |",
            f"| after {last} GRPO steps | **{evals[-1][1]:.3f}** "
            f"({', '.join(f'{a:.3f}' for _, a in evals)} at steps "
            f"{', '.join(str(s) for s, _ in evals)}) | {no_tool[f'step{last}']:.3f} |"]
    warm = [r["compiles"] for r in rows[1:]]
    sizes = sorted({r["group_size"] for r in rows})
    out.append(f"\ncompiles after warm-up (steps 2..): {sum(warm)}; group sizes used: {sizes}")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path, help="a run dir (or its committed copy)")
    ap.add_argument("--block", type=int, default=25, help="steps per row of the first table")
    args = ap.parse_args()
    print(figures(args.run, args.block))


if __name__ == "__main__":
    main()
