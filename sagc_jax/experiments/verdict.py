"""Issue 49's verdict read off a `curves.summarize_curves` summary (pure functions of its dict).

- `verdict_md`: SAGC against the best and worst static G per clock, on the issue's targets;
- `seeds_needed_md`: the seeds a policy would need to resolve the time target's 1.1 x margin;
- `paired_md`: SAGC minus each static G *seed by seed*. Runs of one seed share the prompt
  stream and the sampling key, so a SAGC run equals its seed's static-G run step for step while
  it chooses that G (tests/test_real_runs.py); the seed-to-seed spread that dominates the
  unpaired standard errors (held-out accuracy 0.46 to 0.88 for one policy) is then common to
  both and cancels in the difference. Also the per-seed table the means come from.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = ["paired_md", "per_seed_md", "seeds_needed_md", "verdict_md"]


def verdict_md(summary: Mapping[str, Any]) -> list[str]:
    """Issue 49's targets per clock, read off `summarize_curves`: SAGC (the policy that decided
    on that clock) against the best and worst static G by accuracy at budget (mean; "best −
    1 se" uses the best static's standard error), its time to target against the fastest
    static's (≤ 1.1×) and its length at budget against the best static's (≤)."""
    lines = ["## Issue 49's targets, per clock", "",
             "| clock | best static (acc) | SAGC acc ≥ best − 1 se | SAGC acc > worst static | "
             "SAGC time to target ≤ 1.1 × fastest static | SAGC length ≤ best static's |",
             "|---|---|---|---|---|---|"]
    for clock, s in summary.items():
        pols = s["policies"]
        sagc = pols.get(f"sagc-{clock}")
        statics = {p: r for p, r in pols.items()
                   if p.startswith("static-") and r["accuracy_at_budget"]["n"]}
        if sagc is None or not statics:
            continue
        acc = {p: r["accuracy_at_budget"] for p, r in statics.items()}
        best = max(acc, key=lambda p: acc[p]["mean"])
        worst = min(acc, key=lambda p: acc[p]["mean"])
        mine = sagc["accuracy_at_budget"]

        def yes(ok: bool | None, detail: str) -> str:
            return f"{'n/a' if ok is None else 'yes' if ok else '**no**'} ({detail})"

        a = mine["mean"]
        ok_best = None if a is None else a >= acc[best]["mean"] - acc[best]["se"]
        ok_worst = None if a is None else a > acc[worst]["mean"]
        times = {p: r["time_to_target_s"]["mean"] for p, r in statics.items()
                 if r["time_to_target_s"]["n"]}
        fast = min(times, key=times.get) if times else None
        t = sagc["time_to_target_s"]["mean"] if sagc["time_to_target_s"]["n"] else None
        # A censored mean is a lower bound: SAGC's can't show "≤", a static's only makes the
        # test harder for SAGC, so both are read as they stand.
        t_cens = bool(sagc["time_to_target_s"].get("censored"))
        ok_t = None if fast is None else (t is not None and not t_cens
                                          and t <= 1.1 * times[fast])
        ge = {p: "≥ " if r["time_to_target_s"].get("censored") else ""
              for p, r in [*statics.items(), ("sagc", sagc)]}
        ln = (sagc.get("len_at_budget") or {}).get("mean")
        lb = (statics[best].get("len_at_budget") or {}).get("mean")
        ok_l = None if ln is None or lb is None else ln <= lb
        def num(v: float | None, f: str) -> str:
            return "–" if v is None else format(v, f)

        b_acc, w_acc = acc[best]["mean"], acc[worst]["mean"]
        cells = [yes(ok_best, f"{num(a, '.3f')} vs {b_acc:.3f}"),
                 yes(ok_worst, f"vs {worst} {w_acc:.3f}"),
                 yes(ok_t, f"{ge['sagc']}{num(t, '.0f')} s vs {fast} "
                           f"{ge.get(fast, '')}{num(times.get(fast), '.0f')} s"),
                 yes(ok_l, f"{num(ln, '.1f')} vs {num(lb, '.1f')} tok")]
        lines.append(f"| `{clock}` | {best} | " + " | ".join(cells) + " |")
    return [*lines, "", *seeds_needed_md(summary)]


def seeds_needed_md(summary: Mapping[str, Any]) -> list[str]:
    """Per clock, the seeds a policy would need for the time target's margin (10 % of the
    fastest static's mean time) to be one standard error of the difference of two policies'
    means: n = 2 sd² / (0.1 t)², on the clocks SAGC is judged on; sd the per-seed standard
    deviation pooled over the policies with two or more uncensored seeds (se × √n each)."""
    out = []
    for clock, s in summary.items():
        if f"sagc-{clock}" not in s["policies"]:
            continue  # a clock SAGC was not judged on (no run decided on it)
        st = [r["time_to_target_s"] for p, r in s["policies"].items()]
        ok = [x for x in st if x["n"] >= 2 and not x.get("censored")]
        statics = [r["time_to_target_s"]["mean"] for p, r in s["policies"].items()
                   if p.startswith("static-") and r["time_to_target_s"]["n"]]
        if not ok or not statics:
            continue
        dof = sum(x["n"] - 1 for x in ok)
        sd = math.sqrt(sum((x["se"] * math.sqrt(x["n"])) ** 2 * (x["n"] - 1) for x in ok) / dof)
        t = min(statics)
        need = math.ceil(2.0 * sd * sd / (0.1 * t) ** 2 - 1e-9)  # not 26 for 25.000000001
        out.append(f"Clock `{clock}`: time to target varies {sd:.0f} s from seed to seed "
                   f"(pooled over {len(ok)} polic{'ies' if len(ok) > 1 else 'y'}, {dof} "
                   f"degree{'s' if dof > 1 else ''} of freedom); for the "
                   f"1.1 × margin ({0.1 * t:.0f} s of the fastest static's {t:.0f} s) to be one "
                   f"standard error of a difference, each policy needs **{need} seeds**.")
    return [*out, ""] if out else []


def _mean_se(vals: list[float]) -> tuple[float, float]:
    a = np.asarray(vals, np.float64)
    return float(a.mean()), float(a.std(ddof=1) / math.sqrt(len(a))) if len(a) > 1 else 0.0


def paired_md(summary: Mapping[str, Any]) -> list[str]:
    """Per clock SAGC was judged on, SAGC against each static G over the seeds both ran:
    accuracy at budget as the mean ± se of the per-seed differences, and time to target as the
    geometric mean of the per-seed ratios SAGC / static with its ± 1 se interval (on the log
    scale). A seed that never reached the target counts at its final clock (a lower bound on
    its time, so its ratio is a bound too: the cell counts them)."""
    lines = ["## SAGC against each static G, seed by seed (paired)", "",
             "Same seed, same prompts and sampling key: the seed-to-seed spread cancels in each "
             "seed's difference (`sagc_jax/experiments/verdict.py`).", "",
             "| clock | SAGC vs | seeds | accuracy at budget, SAGC − static | time to target, "
             "SAGC ÷ static (geometric mean, ± 1 se) |", "|---|---|---|---|---|"]
    rows = 0
    for clock, s in summary.items():
        pols = s["policies"]
        mine = pols.get(f"sagc-{clock}")
        if mine is None:
            continue
        for p, r in pols.items():
            if not p.startswith("static-"):
                continue
            a, b = mine["per_seed_accuracy_at_budget"], r["per_seed_accuracy_at_budget"]
            both = sorted((k for k in a.keys() & b.keys()
                           if a[k] is not None and b[k] is not None), key=int)
            if not both:
                continue
            m, se = _mean_se([a[k] - b[k] for k in both])
            acc = f"{m:+.3f} ± {se:.3f}"
            ta = mine.get("per_seed_time_to_target_s", {})
            tb = r.get("per_seed_time_to_target_s", {})
            tk = [k for k in both if k in ta and k in tb]
            if tk:
                logs = [math.log((ta[k][0] or ta[k][1]) / (tb[k][0] or tb[k][1])) for k in tk]
                lm, lse = _mean_se(logs)
                cens = sum(ta[k][0] is None or tb[k][0] is None for k in tk)
                tt = (f"{math.exp(lm):.2f}× [{math.exp(lm - lse):.2f}, {math.exp(lm + lse):.2f}]"
                      + (f" ({cens} of {len(tk)} censored)" if cens else ""))
            else:
                tt = "n/a"
            lines.append(f"| `{clock}` | {p} | {len(both)} | {acc} | {tt} |")
            rows += 1
    return [*lines, "", *per_seed_md(summary)] if rows else []


def _seed_cell(acc: float | None, t: list | None) -> str:
    """"accuracy / seconds to target" (≥ final clock: never reached; – : no value)."""
    if acc is None:
        return "–"
    when = "–" if t is None else f"{t[0]:.0f}" if t[0] is not None else f"≥ {t[1]:.0f}"
    return f"{acc:.3f} / {when}"


def per_seed_md(summary: Mapping[str, Any]) -> list[str]:
    """Per clock, each policy's accuracy at budget and time to target (s; ≥: never reached,
    its final clock) seed by seed: the numbers behind every mean above."""
    out = []
    for clock, s in summary.items():
        pols = s["policies"]
        seeds = sorted({k for r in pols.values() for k in r["per_seed_accuracy_at_budget"]},
                       key=int)
        out += [f"Clock `{clock}`, per seed (accuracy at budget / time to target, s):", "",
                "| policy | " + " | ".join(f"seed {k}" for k in seeds) + " |",
                "|---|" + "---|" * len(seeds)]
        for p, r in pols.items():
            acc, tt = r["per_seed_accuracy_at_budget"], r.get("per_seed_time_to_target_s", {})
            out.append(f"| {p} | " + " | ".join(_seed_cell(acc.get(k), tt.get(k))
                                                for k in seeds) + " |")
        out.append("")
    return out
