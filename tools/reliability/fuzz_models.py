"""Damaged and foreign model files: what `model.path` may hold that we cannot load.

A tiny llama GGUF (float32 tensors, a byte-level BPE tokenizer in its metadata) and a tiny HF
directory (`config.json` + `model.safetensors`, the packaged tokenizer) are written once, then
each case damages a copy, seeded:

  gguf_truncated        the file cut at a random byte (an interrupted download)
  gguf_architecture     `general.architecture` one we do not load (falcon, gemma, ...)
  gguf_missing_tensor   one random tensor left out (not output.weight: see `_damage`)
  st_truncated          model.safetensors cut at a random byte
  st_missing_tensor     one random tensor left out of model.safetensors
  st_extra_tensor       a tensor this architecture does not have added
  vocab_mismatch        config.json's vocab_size below its tokenizer's token count (a
                        tokenizer that does not fit the weights)

and the trainer's start-up path reads it (`load_run_tokenizer`, then `from_pretrained`, the
order `build_run` uses). A case passes when the error is one the CLI exits 2 for
(`sagc_jax.cli.input_errors`), on one line, naming the file and, where one is at fault, the
tensor or the architecture. A cut that leaves every byte the loader reads (e.g. trailing
padding) may load, and passes only if every weight equals the pristine file's. With `cli`,
the first case of each kind also runs `sagc-jax train` in a subprocess: exit 2 and a last line
naming the file. Every case is recorded (kind, seed, what was done, outcome, exit code, line).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from .cases import Result

KINDS = ("gguf_truncated", "gguf_architecture", "gguf_missing_tensor", "st_truncated",
         "st_missing_tensor", "st_extra_tensor", "vocab_mismatch")
FOREIGN = ("falcon", "gemma", "gemma2", "phi3", "mamba", "bert", "gpt2", "qwen3moe", "starcoder2",
           "t5", "bloom", "mpt", "stablelm", "olmo", "deepseek2", "command-r")
ROOT = Path(__file__).resolve().parents[2]
H, FF, LAYERS, HEADS, KV = 64, 128, 2, 4, 2
MERGES = ["Ġ t", "h e", "Ġt he"]
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def _tokens() -> list[str]:
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return ([bytes_to_unicode()[b] for b in range(256)] + [m.replace(" ", "") for m in MERGES]
            + SPECIALS)


def _gguf_tensors(vocab: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """GGUF name -> float32 array in gguf-py's numpy order ([out, in])."""
    hd = H // HEADS
    shapes = {"token_embd.weight": (vocab, H), "output_norm.weight": (H,),
              "output.weight": (vocab, H)}
    for i in range(LAYERS):
        shapes |= {f"blk.{i}.attn_norm.weight": (H,), f"blk.{i}.ffn_norm.weight": (H,),
                   f"blk.{i}.attn_q.weight": (H, H), f"blk.{i}.attn_k.weight": (KV * hd, H),
                   f"blk.{i}.attn_v.weight": (KV * hd, H), f"blk.{i}.attn_output.weight": (H, H),
                   f"blk.{i}.ffn_gate.weight": (FF, H), f"blk.{i}.ffn_up.weight": (FF, H),
                   f"blk.{i}.ffn_down.weight": (H, FF)}
    return {n: (0.05 * rng.standard_normal(s)).astype(np.float32) for n, s in shapes.items()}


def write_gguf(path: Path, *, arch: str = "llama", drop: str | None = None) -> Path:
    """The tiny llama file (seed 0), under `arch`'s key names, without tensor `drop`."""
    import gguf

    toks = _tokens()
    w = gguf.GGUFWriter(os.fspath(path), arch)
    w.add_name("tiny")
    w.add_context_length(256)
    w.add_embedding_length(H)
    w.add_block_count(LAYERS)
    w.add_feed_forward_length(FF)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(H // HEADS)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(toks)
    w.add_token_types([3 if t in SPECIALS else 1 for t in toks])
    w.add_token_merges(MERGES)
    w.add_bos_token_id(toks.index("<|im_start|>"))
    w.add_eos_token_id(toks.index("<|im_end|>"))
    w.add_pad_token_id(toks.index("<|endoftext|>"))
    for name, x in _gguf_tensors(len(toks), np.random.default_rng(0)).items():
        if name != drop:
            w.add_tensor(name, x)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def write_hf_dir(path: Path) -> Path:
    """A tiny fresh model saved as an HF directory with the packaged tokenizer."""
    from flax import nnx

    from sagc_jax.data.tokenizer import load_tokenizer
    from sagc_jax.models.config import ModelConfig
    from sagc_jax.models.hf import save_pretrained
    from sagc_jax.models.llama import Transformer

    tok = load_tokenizer(None)
    cfg = ModelConfig(vocab_size=len(tok), hidden_size=H, intermediate_size=FF,
                      num_layers=LAYERS, num_heads=HEADS, num_kv_heads=KV, head_dim=H // HEADS,
                      max_position_embeddings=256, tie_word_embeddings=False)
    save_pretrained(Transformer(cfg, rngs=nnx.Rngs(0)), path, tokenizer=tok)
    return path


def _weights(model: Any) -> dict[str, np.ndarray]:
    from flax import nnx

    from sagc_jax.models.hf import flatten_params

    return {k: np.asarray(v) for k, v in flatten_params(nnx.to_pure_dict(nnx.state(model)))}


def _load(path: str) -> dict[str, np.ndarray]:
    """What `build_run` does with `model.path` first: tokenizer (checked), then the weights."""
    from sagc_jax.data.tokenizer import load_run_tokenizer
    from sagc_jax.models.pretrained import from_pretrained

    load_run_tokenizer(None, path)
    return _weights(from_pretrained(path)[0])


def _damage(kind: str, rng: random.Random, base: dict[str, Path], d: Path) -> tuple[str, str,
                                                                                 list[str]]:
    """Writes case `kind`'s file under `d`: (model.path, what was done, words the error must
    contain besides the file)."""
    from safetensors.numpy import load_file, save_file

    if kind == "gguf_truncated":
        data = base["gguf"].read_bytes()
        cut = rng.randrange(1, len(data))
        (d / "m.gguf").write_bytes(data[:cut])
        return str(d / "m.gguf"), f"cut at byte {cut} of {len(data)}", ["not a readable GGUF"]
    if kind == "gguf_architecture":
        arch = rng.choice(FOREIGN)
        write_gguf(d / "m.gguf", arch=arch)
        return str(d / "m.gguf"), f"general.architecture {arch}", [f"'{arch}' is not supported"]
    if kind == "gguf_missing_tensor":
        # Not output.weight: a GGUF without it is a tied-embedding model by the format's own
        # convention (llama.cpp reads it so, as we do), a different valid model, not damage.
        names = sorted(set(_gguf_tensors(len(_tokens()), np.random.default_rng(0)))
                       - {"output.weight"})
        name = rng.choice(names)
        write_gguf(d / "m.gguf", drop=name)
        return str(d / "m.gguf"), f"without {name}", [f"'{name}'"]
    shutil.copytree(base["hf"], d / "m")
    st = d / "m" / "model.safetensors"
    if kind == "vocab_mismatch":
        cfg_file = d / "m" / "config.json"
        hf = json.loads(cfg_file.read_text())
        vocab = rng.randrange(8, hf["vocab_size"])
        cfg_file.write_text(json.dumps({**hf, "vocab_size": vocab}))
        return str(d / "m"), f"config.json vocab_size {hf['vocab_size']} -> {vocab}", [
            f"vocab_size {vocab}", "tokens"]
    if kind == "st_truncated":
        data = st.read_bytes()
        cut = rng.randrange(1, len(data))
        st.write_bytes(data[:cut])
        return str(d / "m"), f"model.safetensors cut at byte {cut} of {len(data)}", [
            "model.safetensors"]
    tensors = load_file(st)
    if kind == "st_missing_tensor":
        name = rng.choice(sorted(tensors))
        del tensors[name]
        save_file(tensors, st)
        return str(d / "m"), f"without {name}", [f"'{name}'", "model.safetensors"]
    name = f"model.layers.{rng.randrange(LAYERS)}.{rng.choice(['mlp', 'self_attn'])}." \
           f"{rng.choice(['extra_proj', 'rotary_emb', 'gate'])}.weight"
    tensors[name] = np.zeros((4, 4), np.float32)
    save_file(tensors, st)
    return str(d / "m"), f"with an extra {name}", [f"'{name}'", "unexpected"]


def _cli(path: str, run_dir: Path) -> tuple[int, str]:
    """`sagc-jax train` with `model.path=path` on the tiny config: exit code, last line."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    p = subprocess.run([sys.executable, "-m", "sagc_jax.cli", "train", "--config",
                        str(ROOT / "configs" / "tiny_cpu.yaml"), f"model.path={path}",
                        f"run.dir={run_dir}", "run.progress=false"],
                       capture_output=True, text=True, env=env, timeout=600)
    lines = p.stderr.strip().splitlines()
    return p.returncode, lines[-1] if lines else ""


def run_model_fuzz(per_kind: int, seed: int, *, cli: bool = True,
                   kinds: tuple[str, ...] = KINDS) -> Result:
    """`per_kind` cases of each kind (case i of a kind is seeded `[seed, kind, i]`)."""
    from sagc_jax.cli import input_errors

    res = Result()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        base = {"gguf": write_gguf(work / "base.gguf"), "hf": write_hf_dir(work / "base_hf")}
        pristine = {"gguf": _load(str(base["gguf"])), "hf": _load(str(base["hf"]))}
        for kind in kinds:
            for i in range(per_kind):
                rng = random.Random(f"{seed}/{kind}/{i}")
                d = work / f"{kind}_{i}"
                d.mkdir()
                path, what, words = _damage(kind, rng, base, d)
                rec: dict[str, Any] = {"kind": kind, "case": i, "seed": f"{seed}/{kind}/{i}",
                                       "damage": what}
                try:
                    got = _load(path)
                except input_errors() as e:
                    msg = str(e)
                    bad = "\n" in msg or path not in msg or not all(w in msg for w in words)
                    rec |= {"outcome": "refused" if not bad else "unclear message",
                            "error": type(e).__name__, "exit": 2, "line": msg}
                except Exception as e:  # anything else would be exit 1 or a traceback
                    rec |= {"outcome": "wrong error", "error": type(e).__name__, "exit": 1,
                            "line": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"}
                else:
                    ref = pristine["gguf" if kind.startswith("gguf") else "hf"]
                    same = got.keys() == ref.keys() and all(
                        np.array_equal(got[k], ref[k]) for k in ref)
                    rec |= {"outcome": "loaded, equal" if same else "loaded, changed",
                            "exit": 0, "line": ""}
                if cli and i == 0:
                    rec["cli_exit"], rec["cli_line"] = _cli(path, d / "run")
                    if rec["cli_exit"] != 2 or path not in rec["cli_line"]:
                        rec["outcome"] = "cli: " + rec["outcome"] + f" (exit {rec['cli_exit']})"
                ok = rec["outcome"] in ("refused", "loaded, equal")
                for k in ("line", "cli_line"):  # the record names files relative to the work dir
                    if k in rec:
                        rec[k] = rec[k].replace(str(work), "<work>")
                res.tried += 1
                res.outcomes[f"{kind}: {rec['outcome']}"] += 1
                res.records.append(rec)
                if not ok:
                    res.failures.append((kind, i, f"{rec['outcome']}: {rec['line']}"))
                shutil.rmtree(d, ignore_errors=True)
    return res
