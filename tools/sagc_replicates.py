"""Expected values over many seeds: is a gap between policies a bias or the luck of the loops?

    python -m tools.sagc_replicates --config configs/sim/drift.yaml --steps 500 --seeds 40

One seed's benefit/s moves by +-6 % with where its rare loops fall (a loop step costs ~7
ordinary ones), so a per-seed comparison of SAGC with a static g, or of one rung with another
inside a phase, mixes the controller's bias with that luck. This runs the chosen policies on
common random numbers for `--seeds` seeds over the first `--steps` steps and prints the pooled
benefit/s (sum of benefit over sum of seconds, all seeds), the per-seed mean and sd, the mean
straggler rate (and whether it is within delta + tolerance), the fraction of steps longer
than 4x the policy's median step (loop steps, mostly), each policy's mean per-seed ratio to the
first one, and the pooled ratio of SAGC to the best static g whose mean rate is in budget.

Then the ceilings, two ways. Per seed: ``sagc-jax simulate``'s causal ceiling and hindsight
oracle solved on each seed's own per-phase figures; they know where that seed's loops fell, i.e.
which rung happened to be lucky (in drift's light phase static-8 and static-4 tie to 0.3 % in
expectation but differ by +-6 % per seed, and the per-seed ceiling takes the better one).
Known parameters: the same programs solved once on per-phase, per-rung means over
``--pop-seeds`` independent seeds (draws only, no controller; seeds from 10**6 up), which is the
plan of a controller that knew the workload exactly but not the draws; that plan is then scored
on the evaluation seeds' own draws (common random numbers with SAGC). SAGC / that figure is the
estimation loss without the luck. Every static rung of the config is run for the ceilings,
whatever ``--policies`` says.

Each SAGC / known-parameter ratio is then split into two factors: *within phases* (SAGC's
benefit over what the plan's per-phase rates would earn in SAGC's own seconds per phase: is it
as good per second inside each phase?) and *across phases* (the rest: how its seconds are spread
over the phases; a controller that runs small, short steps in a fast phase that a slow one
follows spends relatively more of the run in the slow phase, which only foresight avoids).
"""

from __future__ import annotations

import argparse
import itertools
import os
from concurrent.futures import ProcessPoolExecutor
from functools import partial

import numpy as np

from sagc_jax.sagc.oracle import (
    oracle_from_trajectories,
    phase_bounds,
    solve_causal,
    solve_oracle,
)
from sagc_jax.sagc.simulate import load_sim_config, make_policies, run_policies

_KEYS = ("benefit", "step_s", "straggler_rate")


def _phase_means(sim, traj: dict, steps: int) -> tuple[dict, np.ndarray, list[int]]:
    """Per-phase, per-rung means of the static trajectories (the ceilings' inputs, [K, G]),
    the steps per phase [K] and the phase bounds."""
    bounds = phase_bounds(steps, list(sim.drift_steps), list(sim.ramps), sim.oracle_window)
    pairs = list(itertools.pairwise(bounds))
    statics = [f"static-{g}" for g in sim.sagc.group_sizes]
    means = {k: np.array([[traj[n][k][a:b].mean() for n in statics] for a, b in pairs])
             for k in _KEYS}
    return means, np.array([b - a for a, b in pairs], np.float64), bounds


def _one(seed: int, config: str, steps: int, names: list[str], sets: list[str]) -> dict:
    sim = load_sim_config(config, [f"seed={seed}", *sets])
    pols = make_policies(sim)
    missing = [n for n in names if n not in pols]
    if missing:
        raise SystemExit(f"--policies: unknown {missing}; this config has {sorted(pols)}")
    statics = [f"static-{g}" for g in sim.sagc.group_sizes]
    run = names + [n for n in statics if n not in names]
    traj = run_policies(sim, {n: pols[n] for n in run}, steps=steps)
    long_s = {n: float(np.median(t["step_s"])) * 4 for n, t in traj.items()}
    out: dict = {n: (float(t["benefit"].sum()), float(t["step_s"].sum()),
                     float((t["step_s"] > long_s[n]).mean()), float(t["straggler_rate"].mean()),
                     np.inf if sim.sagc.delta is None else sim.sagc.delta + sim.tolerance)
           for n, t in traj.items() if n in names}
    out["_phase"], out["_steps"], bounds = _phase_means(sim, traj, steps)
    if "sagc" in traj:  # SAGC's own per-phase sums, for the within / across-phase split
        out["_sagc_phase"] = np.array([[traj["sagc"][k][a:b].sum() for k in ("benefit", "step_s")]
                                       for a, b in itertools.pairwise(bounds)])
    for causal in (True, False):  # this seed's own ceilings
        sched, _ = oracle_from_trajectories(traj, sim.sagc.group_sizes, bounds,
                                            sim.sagc.delta, causal=causal)
        out["_causal" if causal else "_oracle"] = sched.benefit_per_s
    out["_cfg"] = (sim.sagc.delta, tuple(sim.sagc.group_sizes))
    return out


def _population(seed: int, config: str, steps: int, sets: list[str]) -> dict:
    """The static rungs' per-phase means on one independent seed (no controller)."""
    sim = load_sim_config(config, [f"seed={seed}", *sets])
    pols = make_policies(sim)
    statics = {f"static-{g}": pols[f"static-{g}"] for g in sim.sagc.group_sizes}
    return _phase_means(sim, run_policies(sim, statics, steps=steps), steps)[0]


def known_plans(pop: list[dict], t: np.ndarray, delta: float | None,
                sizes) -> dict[str, np.ndarray]:
    """The known-parameter plans: the causal and hindsight programs solved once on the
    per-phase, per-rung means over the independent seeds ``pop`` (``_population``'s outputs);
    t: steps per phase [K]. Returns {"causal", "oracle"} -> time fractions [K, G]."""
    mean = {k: np.mean([p[k] for p in pop], axis=0) for k in _KEYS}
    return {name: solve(t, mean["benefit"], mean["step_s"], mean["straggler_rate"], delta,
                        sizes).fractions
            for name, solve in (("causal", solve_causal), ("oracle", solve_oracle))}


def score_plan(x: np.ndarray, t: np.ndarray, phase: dict) -> tuple[float, float, float]:
    """A plan's time fractions x [K, G] scored on per-phase, per-rung means ``phase`` (one
    seed's, or the mean over seeds): (benefit, seconds, mean straggler rate) over the run."""
    w = t[:, None] * x
    return (float((w * phase["benefit"]).sum()), float((w * phase["step_s"]).sum()),
            float((w * phase["straggler_rate"]).sum() / t.sum()))


def _ceilings(out: list[dict], pop: list[dict], pooled_sagc: float) -> None:
    """Print the per-seed ceilings, the known-parameter plans scored on the evaluation draws,
    and SAGC's pooled ratio to each."""
    delta, sizes = out[0]["_cfg"]
    t = out[0]["_steps"]
    plans = known_plans(pop, t, delta, sizes)
    evald = {k: np.mean([o["_phase"][k] for o in out], axis=0) for k in _KEYS}
    sagc_phase = np.mean([o["_sagc_phase"] for o in out], axis=0)
    print(f"ceilings ({len(pop)} independent seeds for the known parameters):")
    for name, key in (("causal", "_causal"), ("oracle", "_oracle")):
        x = plans[name]
        w = t[:, None] * x
        ben, sec, rate = score_plan(x, t, evald)
        score = ben / sec
        plan = " / ".join(
            "+".join(f"{g}:{f:.2f}" if f < 0.995 else str(g)
                     for g, f in zip(sizes, row) if f > 0.005) for row in x)
        per_seed = float(np.mean([o[key] for o in out]))
        print(f"  {name}: per seed (knows each seed's draws) mean {per_seed:.4f}, sagc / it "
              f"{pooled_sagc / per_seed:.3f}; known parameters: plan {plan}, scored on these "
              f"seeds {score:.4f} (rate {rate:.3f}), sagc / it {pooled_sagc / score:.3f}")
        within, across = _split(sagc_phase, (w * evald["benefit"]).sum(1),
                                (w * evald["step_s"]).sum(1))
        print(f"    = within phases {within:.3f} x across phases {across:.3f} (the plan's "
              f"per-phase rates at SAGC's seconds per phase; across = how SAGC's time is "
              f"spread over the phases)")


def _split(sagc: np.ndarray, plan_b: np.ndarray, plan_s: np.ndarray) -> tuple[float, float]:
    """SAGC / plan benefit per second = within x across.

    sagc: [K, 2] SAGC's benefit and seconds per phase (mean per seed); plan_b, plan_s: [K] the
    plan's. within = SAGC's benefit / the benefit the plan's per-phase rates would earn in
    SAGC's seconds per phase (1 = as good per second inside every phase); across = that
    counterfactual's benefit/s over the plan's (< 1: more of SAGC's time falls in the phases
    with low rates, e.g. it ran small steps in a fast phase that a slower one follows).
    """
    cf = float((plan_b / plan_s * sagc[:, 1]).sum() / sagc[:, 1].sum())
    return float(sagc[:, 0].sum() / sagc[:, 1].sum()) / cf, cf / float(plan_b.sum() / plan_s.sum())


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--seeds", type=int, default=40)
    ap.add_argument("--policies", default="static-4,static-8,sagc",
                    help="comma-separated; ratios are to the first")
    ap.add_argument("--set", nargs="*", default=[], help="simulator overrides (key=value)")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--pop-seeds", type=int, default=200,
                    help="independent seeds for the known-parameter ceilings (0: skip them)")
    a = ap.parse_args(argv)
    names = a.policies.split(",")
    run = partial(_one, config=a.config, steps=a.steps, names=names, sets=a.set)
    pop_run = partial(_population, config=a.config, steps=a.steps, sets=a.set)
    pop_seeds = range(10**6, 10**6 + a.pop_seeds)
    if a.workers == 1:
        out = [run(seed) for seed in range(a.seeds)]
        pop = [pop_run(seed) for seed in pop_seeds]
    else:
        with ProcessPoolExecutor(a.workers) as ex:
            out = list(ex.map(run, range(a.seeds)))
            pop = list(ex.map(pop_run, pop_seeds))
    base = np.array([o[names[0]][0] / o[names[0]][1] for o in out])
    print(f"{a.config}, steps 0-{a.steps}, seeds 0-{a.seeds - 1} "
          f"(load average {os.getloadavg()[0]:.1f})")
    print("| policy | pooled benefit/s | per-seed mean ± sd | straggler rate | long-step fraction "
          f"| mean ratio to {names[0]} | seeds above {names[0]} |")
    print("|---|---|---|---|---|---|---|")
    pooled, in_budget = {}, {}
    for n in names:
        v = np.array([o[n] for o in out])
        bs = v[:, 0] / v[:, 1]
        pooled[n] = v[:, 0].sum() / v[:, 1].sum()
        rate = v[:, 3].mean()
        in_budget[n] = rate <= v[0, 4]
        print(f"| {n} | {pooled[n]:.4f} | {bs.mean():.4f} ± {bs.std():.4f} "
              f"| {rate:.3f}{'' if in_budget[n] else ' (over)'} | {v[:, 2].mean():.4f} "
              f"| {(bs / base).mean():.3f} | {(bs > base).sum()}/{len(bs)} |")
    statics = [n for n in names if n.startswith("static-") and in_budget[n]]
    if "sagc" in pooled and statics:
        best = max(statics, key=pooled.get)
        print(f"pooled sagc / best in-budget static ({best}): {pooled['sagc'] / pooled[best]:.3f}")
    if "sagc" in pooled and pop:
        _ceilings(out, pop, float(pooled["sagc"]))


if __name__ == "__main__":
    main()
