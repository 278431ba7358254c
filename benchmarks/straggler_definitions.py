"""Straggler definitions compared (issue 32, part 0): per rung, how often each candidate flags a
group / what cost it charges, on the real SmolLM2 probe trace and synthetic workloads, and how well
it tracks the decode time actually wasted.

Candidates (per group of g rows, lengths L, truncated flags; per step of B groups):
  group_ratio   today's event: max L > 2 x median L, or a truncated member (0/1)
  tail_share    (max L - median L) / max L: the share of the group's decode steps run for its
                tail only (continuous, [0, 1))
  excess_share  max(0, max L - 2 x median L) / max L: the share of the group's decode steps run
                beyond twice its median (today's event made continuous; truncation counts
                through length)
  quantile      max L > the run's 0.9-quantile of untruncated lengths (0/1; truncation counts
                only through length)
  batch_tail    (max - q0.9) / max over the whole step's rows (one number per step)
Wasted decode (the target): per group 1 - mean L / max L; per step the same over all its rows.

Real trace, two ways: groups of g bootstrapped from one problem's recorded rows (with
replacement; duplicates understate the tail), and the simulator's replay (configs/sim/
real/smollm2_probe_replay.yaml: a problem's recorded rows without replacement, the median x
residual model beyond them) -- the replay is what the controller is judged on. Synthetic:
the simulator's own draws, sliced [:, :g] as ``run_step`` does. Usage:
  python benchmarks/straggler_definitions.py [--steps 200] [--seeds 2] [--out table.md]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from sagc_jax.sagc.simulate import load_sim_config
from sagc_jax.sagc.workload import load_trace_groups

ROOT = Path(__file__).resolve().parents[1]
REAL = ROOT / "configs/sim/traces/smollm2_t1_probe_trace.jsonl"
REAL_SIM = "real/smollm2_probe_replay"  # the simulator's replay of REAL (recorded rows first)
SYNTH = ("heavy_tail", "bimodal", "loop_bursts")
SIZES = (4, 8, 16)
CANDS = ("group_ratio", "tail_share", "excess_share", "quantile", "batch_tail")


def group_measures(lengths: np.ndarray, truncated: np.ndarray, q90: float) -> dict[str, np.ndarray]:
    """lengths/truncated [S, B, g] -> per-group measures [S, B] and per-step ones [S]."""
    lengths = lengths.astype(np.float64)
    mx, med = lengths.max(-1), np.median(lengths, -1)
    flat = lengths.reshape(len(lengths), -1)
    bmx = flat.max(-1)
    return {
        "group_ratio": ((mx > 2.0 * med) | truncated.any(-1)).astype(np.float64),
        "tail_share": (mx - med) / mx,
        "excess_share": np.maximum(mx - 2.0 * med, 0.0) / mx,
        "quantile": (mx > q90).astype(np.float64),
        "batch_tail": (bmx - np.quantile(flat, 0.9, axis=-1)) / bmx,
        "waste_group": 1.0 - lengths.mean(-1) / mx,
        "waste_step": 1.0 - flat.mean(-1) / bmx,
    }


def real_draws(g: int, steps: int, rng: np.random.Generator, b: int = 16):
    """Bootstrap [steps, b, g] blocks from the real trace's problems."""
    groups, _ = load_trace_groups(REAL)
    pick = rng.integers(0, len(groups), (steps, b))
    lens = np.zeros((steps, b, g), np.int64)
    trs = np.zeros((steps, b, g), bool)
    for s in range(steps):
        for j, gi in enumerate(pick[s]):
            L, T = groups[gi].lengths, groups[gi].truncated
            idx = rng.integers(0, len(L), g)
            lens[s, j], trs[s, j] = L[idx], T[idx]
    return lens, trs


def synth_draws(name: str, g: int, steps: int, seed: int):
    sim = load_sim_config(ROOT / f"configs/sim/{name}.yaml", [f"seed={seed}"])
    d = [sim.workload.draw(t) for t in range(steps)]
    b = sim.prompts_per_step
    return (
        np.stack([x.lengths[:b, :g] for x in d]),
        np.stack([x.truncated[:b, :g] for x in d]),
    )


def row(name: str, draws) -> dict[str, dict[int, float]]:
    """Mean measure per candidate and rung, and correlations with waste (pooled over rungs)."""
    out: dict[str, dict] = {c: {} for c in CANDS}
    corr: dict[str, list] = {c: [[], []] for c in CANDS}
    for g in SIZES:
        lens, trs = draws(g)
        q90 = float(np.quantile(lens[~trs], 0.9)) if (~trs).any() else float(lens.max())
        m = group_measures(lens, trs, q90)
        for c in CANDS:
            out[c][g] = float(m[c].mean())
            target = m["waste_step"] if c == "batch_tail" else m["waste_group"]
            corr[c][0].append(m[c].ravel())
            corr[c][1].append(target.ravel())
    for c in CANDS:
        x, y = np.concatenate(corr[c][0]), np.concatenate(corr[c][1])
        out[c]["corr"] = float(np.corrcoef(x, y)[0, 1]) if x.std() > 0 else float("nan")
    out["_name"] = name
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--out")
    a = ap.parse_args()
    rows = []
    rng = np.random.default_rng(0)
    rows.append(
        row("SmolLM2 T=1 (real, bootstrap w/ repl.)", lambda g: real_draws(g, a.steps, rng))
    )
    rows.append(
        row("SmolLM2 T=1 (real, sim replay)", lambda g: synth_draws(REAL_SIM, g, a.steps, 0))
    )
    for name in SYNTH:
        for seed in range(a.seeds):
            rows.append(
                row(f"{name} s{seed}", lambda g, n=name, s=seed: synth_draws(n, g, a.steps, s))
            )
    lines = [
        "| workload | candidate | G=4 | G=8 | G=16 | corr. with wasted decode |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        for c in CANDS:
            v = r[c]
            lines.append(
                f"| {r['_name']} | {c} | {v[4]:.3f} | {v[8]:.3f} | {v[16]:.3f} | {v['corr']:.2f} |"
            )
    text = "\n".join(lines)
    print(text)
    if a.out:
        Path(a.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
