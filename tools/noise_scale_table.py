"""The gradient noise scale of real runs, from their committed metrics.jsonl (`rl.noise_scale`).

    python -m tools.noise_scale_table RUN_DIR [RUN_DIR ...] [--window 4]

For each run, each window of `--window` updates and the whole run: B_noise in rows (numerators and
denominators summed over the window's updates before the ratio, McCandlish et al. 2018, A.1),
the rows a step scored, the informative share of its groups (1 − frac_reward_zero_std), and
what a step's progress n / (n + B) would be at each G with the run's prompts a step, n = prompts
× G rows (B counts rows of every kind, as the loss does: an uninformative group's rows carry a
zero gradient). Markdown on stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from sagc_jax.rl.noise_scale import noise_scale_rows

GROUP_SIZES = (4, 8, 16)


def read_rows(run_dir: Path) -> list[dict]:
    """The run's per-step metrics that carry the noise-scale terms."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()
            if line.strip()]
    keep = [r for r in rows if "noise_chunk_grad_sq" in r and "grad_norm" in r]
    if not keep:
        raise SystemExit(f"noise_scale_table: {run_dir}/metrics.jsonl has no noise-scale terms "
                         "(noise_chunk_grad_sq): run with a learner that logs them")
    return keep


def window_md(run_dir: Path, window: int) -> list[str]:
    """One table row per window of the run, then one for the whole run."""
    rows = read_rows(run_dir)
    out = []
    spans = [rows[i:i + window] for i in range(0, len(rows), window)]
    for w in spans + ([rows] if len(spans) > 1 else []):
        b = noise_scale_rows([r["grad_norm"] ** 2 for r in w],
                             [r["noise_chunk_grad_sq"] for r in w],
                             [r["noise_weight_share"] for r in w], [r["scored_rows"] for r in w])
        prompts = w[0]["prompts"]
        inf = sum(1.0 - r["frac_reward_zero_std"] for r in w) / len(w)
        if b is None:
            prog = "–"
        else:
            prog = " / ".join(f"{n / (n + b):.3f}" for n in (prompts * g for g in GROUP_SIZES))
        bs = "–" if b is None else f"{b:.1f}"
        out.append(f"| {run_dir.name} | {w[0]['step']}–{w[-1]['step']} | {w[0]['group_size']} | "
                   f"{sum(r['scored_rows'] for r in w) / len(w):.0f} | {inf:.2f} | {bs} | "
                   f"{prog} |")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--window", type=int, default=4)
    a = ap.parse_args(argv)
    print("| run | steps | G | rows scored | informative share of groups | B_noise (rows) | "
          "n / (n + B) at G = " + " / ".join(map(str, GROUP_SIZES)) + " |")
    print("|---|---|---:|---:|---:|---:|---|")
    for run in a.runs:
        print("\n".join(window_md(run, a.window)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
