"""The controller-constants ablation's page from its raw files (issue 49 item 4).

    python -m tools.sagc_ablation_table        # rewrites benchmarks/sagc_ablation.md

`bash tools/sagc_ablation.sh <part>` runs the simulator suite once per variant (a controller
constant at another value) and keeps each run's figures in
``benchmarks/results/sagc_ablation/<part>/<variant>.json``. This reads every such file, checks
that they are comparable (same seeds, and shipped SAGC's figures identical in each: the same
controller on the same draws), and writes one table per part: for each variant, its pooled
benefit/s against shipped SAGC on the same seeds on every workload, the largest loss and gain,
and a verdict per constant by the ablation's rule (`tools.sagc_suite.ABLATION_BAR`): a constant
that no workload moves by more than the bar, at either value, is one to derive or remove.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tools.sagc_suite import ABLATION_BAR, ROOT

RESULTS = ROOT / "benchmarks" / "results" / "sagc_ablation"
PAGE = ROOT / "benchmarks" / "sagc_ablation.md"
#: The parts of `tools/sagc_ablation.sh`, in page order, with what each one's runs hold fixed.
PARTS = {
    "nobudget": "no straggler budget, `benefit: any_group` (the shipped default) judged by its "
                "own law (`progress: any_group`) at the real runs' 2 prompts a step, where its G "
                "moves; `timing: model`",
    "measured": "as `nobudget`, with `timing: measured` on a clock with 15 % log-noise and "
                "30 % drift",
    "budget": "each workload's stated budget (δ), for the constants only a budget reads",
    "nobudget_groups": "no budget, `benefit: groups` (the default until 2026-12-07; the first "
                       "variants, run before the switch)",
    "nobudget_pinned": "no budget, `benefit: any_group` judged by `groups` at the workloads' 16 "
                       "prompts a step (2026-12-07): SAGC sits at G = 4 on 13 of 15 workloads "
                       "there, so no constant can move it; kept as the record of why `nobudget` "
                       "changed",
}

#: What a verdict led to, by (part, constant): the page states it beside the verdict, so a
#: reader sees which "derive or remove" is still open.
_DERIVED = "derived 2026-12-07: `change_window` / 2 (the same 16; flag `step_memory`)"
_TO_BUDGET = "not read without a budget: its values moved to the `budget` part"
ACTED = {
    ("nobudget_pinned", "window_steps"): _DERIVED, ("nobudget_groups", "window_steps"): _DERIVED,
    ("nobudget_pinned", "rate_half_life_x"): _TO_BUDGET,
    ("nobudget_groups", "rate_half_life_x"): _TO_BUDGET,
    ("nobudget", "step_memory"): "the step window stays (its length derived: `change_window` "
                                 "/ 2)",
    ("nobudget", "length_half_life_x"): "removed 2026-12-07: the truncation rate's memory is "
                                        "`half_life` itself",
    ("nobudget", "change_window"): "derived 2026-12-08: a third of `half_life` rounded to a "
                                   "power of two (the same 32 at the default 100)",
    ("nobudget", "max_rung_step"): "read under a budget too: decided with the `budget` part",
    ("nobudget", "mc_samples"): "not yet acted: its removal is exact computation in place of "
                                "Monte Carlo (recorded runs replay under 64)",
    ("nobudget", "pass_threshold"): "not measurable on this suite: its rewards are 0/1 but for "
                                    "<= 2.4 % of the SmolLM2 traces' rows, where any value in "
                                    "(0, 1) is the same rule; kept as the midpoint of [0, 1] "
                                    "rewards, the definition of a pass",
    ("nobudget", "trend_half_life_x"): "the trend stays: none (0) costs length_growth 2.5 % "
                                       "(gains drift 1.0 %); its memory, 1.5x to 6x alike, is "
                                       "still to derive",
}


def load_part(folder: Path) -> tuple[dict, dict[str, list[str]], list[dict]]:
    """(merged suite figures, variant name -> overrides, each file's meta) of one part's JSONs.
    ValueError naming the file when one is not comparable with the first."""
    files = sorted(folder.glob("*.json"))
    if not files:
        raise ValueError(f"{folder}: no variant JSON yet")
    res: dict = {}
    variants: dict[str, list[str]] = {}
    metas = []
    for f in files:
        d = json.loads(f.read_text())
        meta = d["meta"]
        metas.append(meta)
        if not res:
            res = {"workloads": {w: {**v, "policies": {"sagc": v["policies"]["sagc"]}}
                                 for w, v in d["workloads"].items()}}
            first = (f, meta)
        for name, ov in meta["variants"].items():
            variants[name] = ov
        if meta["variant_seeds"] != first[1]["variant_seeds"] or set(d["workloads"]) != set(
                res["workloads"]):
            raise ValueError(f"{f}: other seeds or workloads than {first[0].name}")
        for w, v in d["workloads"].items():
            if v["policies"]["sagc"]["benefit_per_s"] != \
                    res["workloads"][w]["policies"]["sagc"]["benefit_per_s"]:
                raise ValueError(f"{f}: shipped SAGC differs from {first[0].name}'s on {w} "
                                 "(another controller or other draws): rerun one of them")
            for name in meta["variants"]:
                res["workloads"][w]["policies"][name] = v["policies"][name]
    return res, variants, metas


def variant_figures(res: dict, name: str) -> dict:
    """A variant's ratio to shipped SAGC per workload, and its largest loss and gain (with
    the workload and the standard error of the per-seed ratio there)."""
    ratios = {w: v["policies"][name]["vs_sagc"][0] for w, v in res["workloads"].items()}
    se = {w: v["policies"][name]["vs_sagc_se"] for w, v in res["workloads"].items()}
    lo, hi = min(ratios, key=ratios.get), max(ratios, key=ratios.get)
    broken = [w for w, v in res["workloads"].items()
              if not v["policies"][name]["meets"] and v["policies"]["sagc"]["meets"]]
    return {"ratios": ratios, "loss": (1 - ratios[lo], se[lo], lo),
            "gain": (ratios[hi] - 1, se[hi], hi), "breaks_budget": broken}


def constant_verdict(figs: list[dict]) -> str:
    """The rule on one constant's variants: kept when moving it loses more than the bar (or
    breaks a budget shipped SAGC meets), to re-examine when a value gains more than the bar,
    else 'moves nothing'."""
    gains = [f for f in figs if f["gain"][0] > ABLATION_BAR]
    losses = [f for f in figs if f["loss"][0] > ABLATION_BAR or f["breaks_budget"]]
    if gains:
        return "**another value gains**: re-examine"
    if losses:
        return "keep (moving it costs)"
    return f"**moves nothing > {ABLATION_BAR:.0%}**: derive or remove"


def part_md(part: str, res: dict, variants: dict[str, list[str]], metas: list[dict]) -> str:
    wls = list(res["workloads"])
    seeds = metas[0]["variant_seeds"]
    commits = sorted({m["commit"] for m in metas})
    cpu = sum(m["cpu_s"] for m in metas) / 60
    loads = [x for m in metas for x in m["load"]]
    out = [f"## {part}: {PARTS.get(part, part)}", "",
           f"{len(variants)} variant{'' if len(variants) == 1 else 's'}, {seeds} seeds each "
           "against shipped SAGC on the same seeds "
           f"(commit {', '.join(f'`{c}`' for c in commits)}; {cpu:.0f} CPU-min computed, load "
           f"average {min(loads):.1f}–{max(loads):.1f}). Cell: pooled benefit/s ÷ shipped "
           "SAGC's; loss and gain ± the standard error of the per-seed ratio.", "",
           "| constant | variant | largest loss | largest gain | breaks a budget | verdict |",
           "|---|---|---|---|---|---|"]
    by_key: dict[str, list[str]] = {}
    for name, ov in variants.items():
        by_key.setdefault(ov[0].split("=")[0], []).append(name)
    for key in sorted(by_key):
        figs = [variant_figures(res, n) for n in by_key[key]]
        verdict = constant_verdict(figs)
        if (part, key) in ACTED:
            verdict += f"; {ACTED[part, key]}"
        for i, (name, f) in enumerate(zip(by_key[key], figs)):
            (lo, lse, lw), (hi, hse, hw) = f["loss"], f["gain"]
            out.append(f"| {'`' + key + '`' if i == 0 else ''} | {', '.join(variants[name])} | "
                       f"{lo:+.1%} ± {100 * lse:.1f} % ({lw}) | {hi:+.1%} ± {100 * hse:.1f} % "
                       f"({hw}) | {', '.join(f['breaks_budget']) or 'no'} | "
                       f"{verdict if i == 0 else ''} |")
    out += ["", "Every variant's ratio per workload:", "",
            "| variant | " + " | ".join(wls) + " |", "|---|" + "---|" * len(wls),
            "| *shipped SAGC's mean G* | " + " | ".join(
                f"*{res['workloads'][w]['policies']['sagc']['mean_g']:.1f}*" for w in wls) + " |"]
    for key in sorted(by_key):
        for name in by_key[key]:
            r = variant_figures(res, name)["ratios"]
            out.append(f"| {', '.join(variants[name])} | "
                       + " | ".join(f"{r[w]:.3f}" for w in wls) + " |")
    return "\n".join(out)


def page_md(results: Path = RESULTS) -> str:
    """The whole page: one section per part that has at least one variant's JSON."""
    out = ["# SAGC's controller constants, each at two other values", "",
           "Generated by `python -m tools.sagc_ablation_table` from "
           "`benchmarks/results/sagc_ablation/<part>/*.json`, which `bash "
           "tools/sagc_ablation.sh <part>` writes one variant at a time (issue 49 item 4). "
           f"Rule: a constant stays only if moving it costs more than {ABLATION_BAR:.0%} "
           "benefit/s on some workload (or breaks a budget shipped SAGC meets); one that no "
           "workload moves by more than that, at either value, is derived or removed; a value "
           "that gains more than that is a default to re-examine. A part that is still running "
           "shows the variants finished so far.", ""]
    missing = []
    for part in PARTS:
        folder = results / part
        if not any(folder.glob("*.json")):
            missing.append(part)
            continue
        out += [part_md(part, *load_part(folder)), ""]
    if missing:
        out.append(f"Not run yet: {', '.join(missing)}.")
    return "\n".join(out).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", type=Path, default=RESULTS)
    ap.add_argument("--out", type=Path, default=PAGE)
    a = ap.parse_args(argv)
    try:
        text = page_md(a.results)
    except (ValueError, KeyError, OSError) as e:
        print(f"sagc_ablation_table: {e}", file=sys.stderr)
        return 2
    a.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
