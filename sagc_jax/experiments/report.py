"""results.md of a comparison: the table (mean ± std over seeds) and the protocol in words."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sagc_jax.experiments.summary import COLUMNS


def format_cell(s: Mapping[str, Any], fmt: str, reached: bool = False) -> str:
    """`mean ± std` of a `spread` dict; 'not reached' / 'n/a' when it has no values; with
    `reached`, notes how many seeds reached the target when not all did."""
    if s["n"] == 0:
        return f"not reached (0/{s['of']})" if reached else "n/a"
    cell = f"{fmt.format(s['mean'])} ± {fmt.format(s['std'])}"
    if reached and s["n"] < s["of"]:
        cell += f" ({s['n']}/{s['of']} reached)"
    return cell


def format_results_md(agg: Mapping[str, Mapping[str, Any]], meta: Mapping[str, Any]) -> str:
    """The results table plus the protocol in words (`meta`: target, window, steps, seeds...)."""
    head = ["policy", *[h for _, h, _ in COLUMNS]]
    lines = [
        "# SAGC vs static group sizes", "",
        f"Config `{meta['config']}`{meta.get('overrides_note', '')}; task `{meta['task']}`; "
        f"{meta['steps']} GRPO steps (cap) x {meta['prompts_per_step']} prompts per step "
        f"(batch policy `{meta['batch_policy']}`); seeds {meta['seeds']}; "
        f"SAGC timing `{meta['sagc_timing']}`, delta {meta['delta']}, rungs {meta['rungs']}.",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "|".join("---" for _ in head) + "|",
    ]
    for pol, stats in agg.items():
        cells = [format_cell(stats[k], fmt, reached=k in ("time_to_target_s", "steps_to_target"))
                 for k, _, fmt in COLUMNS]
        lines.append("| " + " | ".join([pol, *cells]) + " |")
    lines += [
        "",
        f"Cells are mean ± sample std over seeds (min and max are in `results.json`). "
        f"Reward target: **{meta['target']:.2f}** ({meta['target_note']}); reached = first step "
        f"whose trailing {meta['window']}-step mean of `reward_mean` is >= the target, and "
        f"time-to-target is the training wall-clock at that step (mean over the seeds that "
        f"reached it).",
        "",
        _budget_line(meta),
        "- **Wall-clock** = " + _clock_words(meta.get("clock", "measured")) + " The SFT warm "
        "start is identical across policies and not counted "
        f"(it took {meta['sft_note']}); compile warm-up is in its own column (static runs "
        "compile one G, SAGC every rung).",
        f"- **Straggler rate** = mean over steps of the fraction of groups with a straggler "
        f"event (budget delta = {meta['delta']} for SAGC). **Final train reward** = mean "
        "`reward_mean` over the last 10 steps. **Completion length** = mean over the last 20 "
        "steps. **Mean G** over all steps.",
        f"- **Held-out accuracy** = greedy accuracy on {meta['eval_prompts']} held-out "
        "problems at the final checkpoint (within the budget: the newest one at or before "
        "the cut; `sagc_jax.evaluate`"
        + (f", pass@{meta['num_samples']} in results.json" if meta["num_samples"] else "")
        + ").",
        "",
        f"Machine: {meta['machine']}. Total time of this comparison (training, SFT, compiles "
        f"and evals, this invocation): {meta['elapsed_s'] / 60:.1f} min.",
        "",
        "Plots: `reward_vs_wallclock.png`, `group_size.png`, `straggler_rate.png`, "
        "`completion_length.png`, `length_distribution.png` (first vs last 5 steps).",
        "",
    ]
    return "\n".join(lines)


def _clock_words(clock: str) -> str:
    if clock == "model":
        return ("**modelled accelerator rollout seconds** (clock `model`: prefill + decode "
                "steps x the linear per-step time of `sagc.time_model`, deterministic; the update "
                "is not modelled). The column 'measured CPU wall-clock' is this machine's real "
                "clock (sum of `step_s`) for the same steps.")
    return ("sum of `step_s` (clock `measured`: rollout + rewards + update; in-training eval "
            "time excluded).")


def _budget_line(meta: Mapping[str, Any]) -> str:
    if meta.get("budget_s") is None:
        return ("- **Why a step budget, not a wall-clock budget:** every policy sees the same "
                "prompts in the same order (same seeds, same prompts per step, same number of "
                "steps), so the comparison differs only in G. Wall-clock is measured and "
                "reported as it came out, on a machine that may be shared: read it relative to "
                "the other policies of the same comparison.")
    caps = meta.get("max_steps") or {}
    return (f"- **Equal wall-clock budget:** every run is read up to {meta['budget_note']}: "
            "its last step whose cumulative clock is within the budget (all columns, plots "
            "and the held-out checkpoint). Runs trained to a step cap"
            + (f" ({', '.join(f'{k} {v}' for k, v in caps.items())})" if caps else "")
            + f" and were cut afterwards; the learning-rate schedule is "
            f"`{meta.get('lr_schedule')}`"
            + (" after warm-up, so a cut run equals a run stopped at the budget."
               if meta.get("lr_schedule") == "constant" else
               " (not constant: a cut run saw a schedule planned for its cap).")
            + " Same seeds and prompt order for every policy; a policy whose steps are cheaper "
            "on the clock trains more steps.")
