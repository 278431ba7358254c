"""Replay a recorded run's observations through SAGC and set its predicted seconds per rung
beside what the step really cost (issue 49's diagnosis of the real-model runs).

    python benchmarks/probes/sagc_cost_replay.py docs/results/sagc_real/arith1/sagc-model-s0
    python benchmarks/probes/sagc_cost_replay.py RUN_DIR --set step_memory=false \\
        --set half_life=12        # the same observations under other settings (counterfactual)
    python benchmarks/probes/sagc_cost_replay.py STATIC_RUN --set 'group_sizes=[4,8,16]'
                                  # what SAGC would have chosen on a static run's observations
    python benchmarks/probes/sagc_cost_replay.py STATIC_RUN --set 'group_sizes=[4,8,16]' \
        --set time_model.decode_a=0.0559 ...   # ... on another clock (a section's field)

The run's own observations are fed back (as `tests/test_real_runs.py` does), so the decisions
printed are what the controller would choose given that history, not a new run. Seconds are the
`model` clock (`sagc.time_model`). Prints per step: logged G, the replayed choice, the
predicted seconds of the logged G, the realised seconds, and the E[decode steps] model inputs.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import numpy as np
import yaml

from sagc_jax.config import load_saved_config
from sagc_jax.config import sagc_constants as sc
from sagc_jax.experiments.replay import logged_observations
from sagc_jax.sagc import make_policy
from sagc_jax.sagc.timing import TimeModel


def replay(run: Path, sets: dict[str, object]) -> list[dict]:
    cfg = load_saved_config(run / "config.yaml")
    names = type(cfg.sagc).model_fields
    consts = {k: v for k, v in sets.items() if k.partition(".")[0] not in names}
    merged = {**cfg.sagc.model_dump(), "enabled": True}
    for k, v in sets.items():  # a dotted key sets one field of a section (time_model.decode_a)
        if k not in consts:
            head, _, leaf = k.partition(".")
            merged[head] = {**merged[head], leaf: v} if leaf else v
    # Validated (not model_copy): --set group_sizes=[4,8,16] replays a static run with every rung.
    sagc = type(cfg.sagc).model_validate(merged)
    out = []
    pol = make_policy(sagc, horizon=cfg.run.steps,
                      consts=dataclasses.replace(sc.CONSTANTS, **consts))
    tm = TimeModel.from_sagc(sagc)
    for logged in logged_observations(run, sagc, cfg.sampling.decode_chunk):
        m, obs = logged.metrics, logged.observation
        choice = pol.choose()
        last = pol.last_choice
        g, n, steps = obs.group_size, obs.rows, obs.decode_steps
        real = tm.prefill_s(n) + steps * tm.decode_step_s(n)
        pred = dict(zip(sagc.group_sizes, last.cost.tolist())) if last else {}
        out.append({"step": m["step"], "g": g, "choice": choice, "pred_s": pred.get(g),
                    "real_s": real, "decode_steps": steps,
                    "exp_steps": dict(zip(sagc.group_sizes,
                                          pol.state.length.exp_steps.tolist()))})
        pol.observe(obs)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--set", action="append", default=[],
                    help="sagc field or SAGC constant: name=value (YAML value)")
    a = ap.parse_args()
    sets = {k: yaml.safe_load(v) for k, _, v in (s.partition("=") for s in a.set)}
    res = replay(a.run, sets)
    print("| step | G logged | G replayed | predicted s (logged G) | realised s | ratio |")
    print("|---:|---:|---:|---:|---:|---:|")
    for r in res:
        if r["pred_s"] is not None and np.isfinite(r["pred_s"]) and r["step"] % 4 == 0:
            print(f"| {r['step']} | {r['g']} | {r['choice']} | {r['pred_s']:.2f} | "
                  f"{r['real_s']:.2f} | {r['pred_s'] / r['real_s']:.1f} |")
    late = [r["pred_s"] / r["real_s"] for r in res if r["step"] > len(res) // 2
            and r["pred_s"] is not None and np.isfinite(r["pred_s"])]
    print(f"\nsecond half: predicted / realised seconds of the G it ran, mean "
          f"{np.mean(late):.2f}; replayed choices "
          + "".join({4: "4", 8: "8", 16: "F"}.get(r["choice"], "?") for r in res))


if __name__ == "__main__":
    main()
