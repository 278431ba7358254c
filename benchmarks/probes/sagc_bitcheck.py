"""Bit-identity check of a SAGC rewrite: run the simulator on every configs/sim config with two
source trees and compare the per-step SAGC group sizes and every policy's summary figures.

    python benchmarks/probes/sagc_bitcheck.py run SRC OUT [--steps 400] [--seeds 0,1] [--variants]
    python benchmarks/probes/sagc_bitcheck.py compare REF_DIR NEW_DIR

``run`` executes ``python -m sagc_jax.sagc.simulate`` with ``PYTHONPATH=SRC`` from SRC (its own
configs) and writes ``OUT/<config>-<seed>.json``; ``--variants`` adds runs with non-default
settings of the kept fields (``VARIANTS``: old-code and new-code overrides that mean the same).
``compare`` exits 1 on any difference in ``policies`` (group_size_trajectory, reasons and every
summary number, compared exactly) or ``delta``; ``sagc_config`` (the schema itself) is not
compared.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

# name -> (config, overrides for the pre-issue-32 code, overrides for the rewrite)
VARIANTS: dict[str, tuple[str, list[str], list[str]]] = {
    "drift_mean_V": ("configs/sim/drift.yaml", ["sagc.risk=mean", "sagc.V=0.5"],
                     ["sagc.risk=mean", "sagc.V=0.5"]),
    "drift_half_life50": (
        "configs/sim/drift.yaml",
        ["sagc.half_life=50.0", "sagc.length_half_life=50.0", "sagc.rate_half_life=250.0",
         "sagc.trend_half_life=150.0", "sagc.credit_horizon=150.0"],
        ["sagc.half_life=50.0"]),
    "drift_tail_share": ("configs/sim/drift.yaml", ["sagc.straggler=tail_share", "sagc.delta=0.6"],
                         ["sagc.straggler=tail_share", "sagc.delta=0.6"]),
    "heavy_tail_tau_warmup": ("configs/sim/heavy_tail.yaml",
                              ["sagc.tau=1.5", "sagc.warmup_steps=10"],
                              ["sagc.tau=1.5", "sagc.warmup_steps=10"]),
    "loop_bursts_rollouts": ("configs/sim/loop_bursts.yaml",
                             ["sagc.batch_policy=rollouts", "sagc.rollouts_per_step=192"],
                             ["sagc.batch_policy=rollouts", "sagc.rollouts_per_step=192"]),
    "bimodal_rungs": ("configs/sim/bimodal.yaml",
                      ["sagc.group_sizes=[2,4,8,16,32]", "sagc.initial_group_size=4",
                       "sagc.window_rows=2048"],
                      ["sagc.group_sizes=[2,4,8,16,32]", "sagc.initial_group_size=4"]),
}


def _configs(src: Path) -> list[Path]:
    return sorted((src / "configs/sim").glob("*.yaml")) + sorted(
        (src / "configs/sim/real").glob("*.yaml"))


def _sim(src: Path, cfg: str, args: list[str], out: Path) -> None:
    if out.exists():
        return
    env = {**os.environ, "PYTHONPATH": str(src)}
    cmd = ["nice", "-n", "10", sys.executable, "-m", "sagc_jax.sagc.simulate", "--config", cfg,
           *args, "--out", str(out)]
    r = subprocess.run(cmd, cwd=src, env=env, capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"FAILED {' '.join(cmd)}:\n{r.stderr[-2000:]}")


def run(src: Path, out: Path, steps: int, seeds: list[int], variants: str | None) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for cfg in _configs(src):
        name = str(cfg.relative_to(src / "configs/sim")).replace("/", "_").removesuffix(".yaml")
        for s in seeds:
            _sim(src, str(cfg), [f"seed={s}", f"steps={steps}"], out / f"{name}-{s}.json")
    if variants:
        for name, (cfg, old, new) in VARIANTS.items():
            for s in seeds:
                args = [f"seed={s}", f"steps={steps}", *(old if variants == "old" else new)]
                _sim(src, cfg, args, out / f"var_{name}-{s}.json")


def compare(ref: Path, new: Path) -> int:
    bad = 0
    files = sorted(p.name for p in ref.glob("*.json"))
    for name in files:
        if not (new / name).exists():
            print(f"MISSING {name}")
            bad += 1
            continue
        a, b = json.loads((ref / name).read_text()), json.loads((new / name).read_text())
        diffs = [k for k in ("policies", "delta", "steps", "tolerance") if a.get(k) != b.get(k)]
        if diffs:
            bad += 1
            pa, pb = a["policies"], b["policies"]
            detail = [p for p in pa if pa[p] != pb.get(p)]
            print(f"DIFF {name}: {diffs} (policies differing: {detail})")
        else:
            traj = a["policies"]["sagc"]["group_size_trajectory"]
            print(f"same {name}: {len(traj)} steps, mean G "
                  f"{a['policies']['sagc']['mean_group_size']:.3f}, reasons "
                  f"{a['policies']['sagc']['reasons']}")
    print(f"{len(files) - bad}/{len(files)} identical")
    return 1 if bad or not files else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("src", type=Path)
    r.add_argument("out", type=Path)
    r.add_argument("--steps", type=int, default=400)
    r.add_argument("--seeds", default="0,1")
    r.add_argument("--variants", choices=["old", "new"], help="also the VARIANTS runs")
    c = sub.add_parser("compare")
    c.add_argument("ref", type=Path)
    c.add_argument("new", type=Path)
    a = ap.parse_args()
    if a.cmd == "run":
        run(a.src.resolve(), a.out.resolve(), a.steps, [int(s) for s in a.seeds.split(",")],
            a.variants)
        return 0
    return compare(a.ref, a.new)


if __name__ == "__main__":
    sys.exit(main())
