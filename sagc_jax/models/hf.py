"""HF checkpoint import/export for the `Transformer` of every family (Llama, Qwen2, Qwen3, Gemma 3
text; safetensors, no torch).

Import reads `config.json` plus `model.safetensors` (or a sharded `model.safetensors.index.json`)
tensor by tensor: each of our stacked params is assembled on the host from its L per-layer HF
tensors, cast to the param dtype (float32 by default), transposed to our [in, out] kernel layout
and placed on its device(s) before the next one is read, so the host never holds the whole model
twice.

Export writes the inverse: torch names, [out, in] kernels, float32, `metadata={"format": "pt"}`,
which `transformers.AutoModelForCausalLM.from_pretrained` loads directly.
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
from collections.abc import Iterator
from typing import Any

import jax
import ml_dtypes
import numpy as np
from flax import nnx
from jax.sharding import Mesh
from safetensors import safe_open
from safetensors.numpy import save_file

from sagc_jax.models.config import ModelConfig
from sagc_jax.models.families import TEXT_TOWERS
from sagc_jax.models.hf_config import from_hf_dict, to_hf_dict
from sagc_jax.models.llama import Transformer
from sagc_jax.models.lora import lora_scale, merge_lora
from sagc_jax.models.sharding import state_shardings

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"

# Our per-layer param name -> (HF name under `model.layers.{i}.`, stored transposed?).
_LAYER_NAMES: dict[str, tuple[str, bool]] = {
    "attn_norm": ("input_layernorm.weight", False),
    "mlp_norm": ("post_attention_layernorm.weight", False),
    "q_proj": ("self_attn.q_proj.weight", True),
    "k_proj": ("self_attn.k_proj.weight", True),
    "v_proj": ("self_attn.v_proj.weight", True),
    "o_proj": ("self_attn.o_proj.weight", True),
    "q_bias": ("self_attn.q_proj.bias", False),
    "k_bias": ("self_attn.k_proj.bias", False),
    "v_bias": ("self_attn.v_proj.bias", False),
    "o_bias": ("self_attn.o_proj.bias", False),
    "gate_proj": ("mlp.gate_proj.weight", True),
    "up_proj": ("mlp.up_proj.weight", True),
    "down_proj": ("mlp.down_proj.weight", True),
    "gate_bias": ("mlp.gate_proj.bias", False),
    "up_bias": ("mlp.up_proj.bias", False),
    "down_bias": ("mlp.down_proj.bias", False),
    "q_norm": ("self_attn.q_norm.weight", False),
    "k_norm": ("self_attn.k_norm.weight", False),
}
# Gemma's four norms a block: HF's `post_attention_layernorm` is the attention output's norm
# there, while in Llama it is the MLP input's (our `mlp_norm`).
_SANDWICH_NAMES: dict[str, tuple[str, bool]] = {
    **_LAYER_NAMES,
    "post_attn_norm": ("post_attention_layernorm.weight", False),
    "mlp_norm": ("pre_feedforward_layernorm.weight", False),
    "post_mlp_norm": ("post_feedforward_layernorm.weight", False),
}
# Our top-level param name -> (HF name, stored transposed?).
_TOP_NAMES: dict[str, tuple[str, bool]] = {
    "embed": ("model.embed_tokens.weight", False),
    "final_norm": ("model.norm.weight", False),
    "lm_head": ("lm_head.weight", True),
}
# Buffers some checkpoints carry that we recompute (RoPE) and can safely skip.
_HARMLESS_SUFFIXES = ("rotary_emb.inv_freq",)
_TIED_HEAD = "lm_head.weight"


def _hf_names(path: str, cfg: ModelConfig) -> tuple[list[str], bool]:
    """HF tensor names making up our param `path` (one per layer for stacked ones)."""
    if path.startswith("layers."):
        table = _SANDWICH_NAMES if cfg.family.sandwich_norms else _LAYER_NAMES
        name, transposed = table[path.removeprefix("layers.")]
        return [f"model.layers.{i}.{name}" for i in range(cfg.num_layers)], transposed
    name, transposed = _TOP_NAMES[path]
    return [name], transposed


def flatten_params(tree: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted path, leaf) of a nested parameter dict (``nnx.to_pure_dict``), depth first."""
    for k, v in tree.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            yield from flatten_params(v, key + ".")
        else:
            yield key, v


def _unflatten(flat: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, v in flat.items():
        *parents, leaf = key.split(".")
        node = out
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = v
    return out


class ModelFileError(ValueError):
    """A model directory's config.json or weights file is missing, truncated or malformed (the
    message names the file)."""


def _open_safetensors(path: str, stack: contextlib.ExitStack):
    """safe_open, with a damaged file reported as one line naming it (not a SafetensorError)."""
    try:
        return stack.enter_context(safe_open(path, framework="numpy"))
    except Exception as e:  # SafetensorError (truncated / bad header), OSError
        size = os.path.getsize(path) if os.path.exists(path) else 0
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ModelFileError(f"{path} ({size} bytes) is not a readable safetensors file: {msg} "
                             "(truncated or incomplete download?)") from None


class _SafetensorsReader:
    """Name -> (file, lazy handle) over one or several safetensors files.

    Uses safetensors' numpy framework; numpy has no bfloat16, so BF16 tensors are read straight
    from the file (memory-mapped, via the safetensors header) as `ml_dtypes.bfloat16`.
    """

    def __init__(self, directory: str, stack: contextlib.ExitStack):
        index_path = os.path.join(directory, INDEX_FILE)
        single_path = os.path.join(directory, WEIGHTS_FILE)
        if os.path.exists(single_path):
            self.source = single_path
            files = {WEIGHTS_FILE}
            self._handles = {WEIGHTS_FILE: _open_safetensors(single_path, stack)}
            self.file_of = dict.fromkeys(self._handles[WEIGHTS_FILE].keys(), WEIGHTS_FILE)
        elif os.path.exists(index_path):
            self.source = index_path
            try:
                with open(index_path, encoding="utf-8") as f:
                    weight_map: dict[str, str] = json.load(f)["weight_map"]
            except (ValueError, KeyError, TypeError) as e:
                raise ModelFileError(f"{index_path} is not a valid safetensors index "
                                     f"({type(e).__name__}: {e})") from None
            files = set(weight_map.values())
            self._handles = {}
            for fname in sorted(files):
                fpath = os.path.join(directory, fname)
                if not os.path.exists(fpath):
                    raise FileNotFoundError(f"{fpath} is listed in {index_path} but missing")
                self._handles[fname] = _open_safetensors(fpath, stack)
            self.file_of = dict(weight_map)
        else:
            raise FileNotFoundError(f"no {WEIGHTS_FILE} or {INDEX_FILE} in {directory}")
        self.directory = directory
        self._keys = {fname: set(h.keys()) for fname, h in self._handles.items()}
        self._headers: dict[str, tuple[int, dict[str, Any]]] = {}

    def where(self, name: str) -> str:
        """The file a tensor lives in (or would, for error messages)."""
        fname = self.file_of.get(name)
        return os.path.join(self.directory, fname) if fname else self.source

    def _handle(self, name: str):
        fname = self.file_of.get(name)
        if fname is None or name not in self._keys[fname]:
            raise ModelFileError(f"tensor '{name}' not found in {self.where(name)}")
        return fname, self._handles[fname]

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._handle(name)[1].get_slice(name).get_shape())

    def get(self, name: str) -> np.ndarray:
        """The tensor as float32 numpy (one copy of this tensor only)."""
        fname, handle = self._handle(name)
        if handle.get_slice(name).get_dtype() == "BF16":
            return self._read_bf16(fname, name).astype(np.float32)
        return np.asarray(handle.get_tensor(name), dtype=np.float32)

    def _read_bf16(self, fname: str, name: str) -> np.ndarray:
        path = os.path.join(self.directory, fname)
        if fname not in self._headers:
            # safetensors layout: u64 little-endian header length, JSON header, then raw data.
            with open(path, "rb") as f:
                (n,) = struct.unpack("<Q", f.read(8))
                self._headers[fname] = (8 + n, json.loads(f.read(n)))
        data_start, header = self._headers[fname]
        info = header[name]
        begin, end = info["data_offsets"]
        raw = np.memmap(path, dtype=np.uint8, mode="r", offset=data_start + begin,
                        shape=(end - begin,))
        return raw.view(ml_dtypes.bfloat16).reshape(info["shape"])


def _tower_names(hf_dict: dict[str, Any], stored: set[str]
                 ) -> tuple[Any, tuple[str, ...]]:
    """(our HF name -> the checkpoint's name, prefixes of tensors to skip): the identity and
    nothing for a text model; for a multimodal checkpoint (`TEXT_TOWERS`), its text tower's names
    in whichever known layout holds the embedding, and its other towers skipped."""
    tower = TEXT_TOWERS.get(hf_dict.get("model_type"))
    if tower is None:
        return (lambda n: n), ()
    layout = next((pairs for pairs in tower.layouts
                   if _swap_prefix("model.embed_tokens.weight", pairs) in stored),
                  tower.layouts[0])
    return (lambda n: _swap_prefix(n, layout)), tower.skipped


def _swap_prefix(name: str, pairs: tuple[tuple[str, str], ...]) -> str:
    for ours, theirs in pairs:
        if name.startswith(ours):
            return theirs + name.removeprefix(ours)
    return name


def from_pretrained(
    path: str | os.PathLike,
    *,
    dtype: str | None = None,
    param_dtype: str | None = None,
    mesh: Mesh | None = None,
) -> tuple[Transformer, ModelConfig]:
    """Loads an HF checkpoint directory (any family in `models/families.py`) into our
    `Transformer`.

    Args:
      path: directory with `config.json` and `model.safetensors` or a sharded
        `model.safetensors.index.json`; a multimodal one (Gemma 3) gives its text decoder.
      dtype: compute dtype ("float32" / "bfloat16").
      param_dtype: storage dtype of the params (default float32); tensors are cast to it on
        the host before they are placed.
      mesh: if given, each param is placed with `state_shardings` on this mesh; otherwise on
        the default device.

    Returns:
      A tuple `(model, cfg)`.

    Raises:
      ValueError: unsupported config field (message names it), missing / unexpected tensors,
        or a tensor whose shape does not match the config (names tensor, expected and got).
      FileNotFoundError: no config or weights.
    """
    path = os.fspath(path)
    cfg_file = os.path.join(path, CONFIG_FILE)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"model directory {path} does not exist")
    try:
        with open(cfg_file, encoding="utf-8") as f:
            hf_dict = json.load(f)
    except FileNotFoundError:
        raise FileNotFoundError(f"{path} has no {CONFIG_FILE} (not a Hugging Face model "
                                "directory)") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise ModelFileError(f"{cfg_file} is not valid JSON ({e})") from None
    cfg = from_hf_dict(hf_dict, dtype=dtype, param_dtype=param_dtype)

    abstract = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(abstract)
    abstract_params = dict(flatten_params(nnx.to_pure_dict(state)))
    shardings = (dict(flatten_params(state_shardings(nnx.to_pure_dict(state), mesh)))
                 if mesh is not None else {})

    with contextlib.ExitStack() as stack:
        reader = _SafetensorsReader(path, stack)
        rename, skipped = _tower_names(hf_dict, set(reader.file_of))
        tied_name = rename(_TIED_HEAD)
        # Pass 1, headers only: every name present with the right shape, nothing unexpected.
        plan: dict[str, tuple[list[str], bool]] = {}
        for p, sds in abstract_params.items():
            names, transposed = _hf_names(p, cfg)
            names = [rename(n) for n in names]
            plan[p] = names, transposed
            want = tuple(sds.shape[1:] if p.startswith("layers.") else sds.shape)
            want = want[::-1] if transposed else want
            for n in names:
                got = reader.shape(n)
                if got != want:
                    raise ModelFileError(f"tensor '{n}' in {reader.where(n)} has shape "
                                         f"{list(got)}, expected {list(want)} from the config")
        expected = {n for names, _ in plan.values() for n in names}
        extra = sorted(n for n in set(reader.file_of) - expected
                       if not n.endswith(_HARMLESS_SUFFIXES) and not n.startswith(skipped))
        tied_head = cfg.tie_word_embeddings and tied_name in extra
        if tied_head:
            extra.remove(tied_name)  # checked against the embedding below
        if extra:
            shown = ", ".join(repr(n) for n in extra[:8])
            more = f" (+{len(extra) - 8} more)" if len(extra) > 8 else ""
            raise ModelFileError(f"unexpected tensors in {reader.source} for this "
                                 f"{cfg.model_type} config: {shown}{more}")

        # Pass 2: one param at a time; a preallocated host buffer, so peak host memory is one
        # param plus one tensor, freed once the param is on its device(s).
        values: dict[str, jax.Array] = {}
        for p, (names, transposed) in plan.items():
            value = np.empty(abstract_params[p].shape, abstract_params[p].dtype)
            for i, n in enumerate(names):
                t = reader.get(n)
                value[i if p.startswith("layers.") else ...] = t.T if transposed else t
            values[p] = (jax.device_put(value, shardings[p]) if mesh is not None
                         else jax.device_put(value))
            del value

        embed = np.asarray(values["embed"])
        if tied_head and not np.array_equal(reader.get(tied_name).astype(embed.dtype), embed):
            # Some tied checkpoints still store the head; fine only if it *is* the embedding.
            raise ValueError(f"tensor '{tied_name}' in {reader.where(tied_name)} differs from "
                             "the embedding but config has tie_word_embeddings=true")

    nnx.replace_by_pure_dict(state, _unflatten(values))
    return nnx.merge(graphdef, state), cfg


def _to_host(x: jax.Array) -> np.ndarray:
    """Full float32 numpy copy of a (possibly sharded, possibly multi-host) array."""
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        from jax.experimental import multihost_utils

        x = multihost_utils.process_allgather(x, tiled=True)
    return np.asarray(jax.device_get(x), dtype=np.float32)


def save_pretrained(model: Transformer, path: str | os.PathLike, *, tokenizer: Any = None) -> None:
    """Writes `config.json` + `model.safetensors` in HF layout (float32, torch names, [out, in]),
    LoRA adapters merged into their weights (`models/peft.py` writes them as a PEFT adapter).

    Tied models write no `lm_head.weight` (as transformers does). Sharded params are gathered to
    the host; with several processes only process 0 writes. If `tokenizer` is given, its
    `save_pretrained(path)` is called too.
    """
    path = os.fspath(path)
    cfg: ModelConfig = model.cfg
    hf_config = to_hf_dict(cfg)  # validates exportability before any gathering
    tensors: dict[str, np.ndarray] = {}
    pure = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    # LoRA adapters are merged into their weights (W + alpha/r * A @ B): a plain HF model.
    pure["layers"] = merge_lora(pure["layers"], lora_scale(cfg))
    for p, x in flatten_params(pure):
        names, transposed = _hf_names(p, cfg)
        arr = _to_host(x)
        parts = list(arr) if p.startswith("layers.") else [arr]
        for n, t in zip(names, parts, strict=True):
            tensors[n] = np.ascontiguousarray(t.T if transposed else t)
    if jax.process_index() != 0:
        return
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, CONFIG_FILE), "w") as f:
        json.dump(hf_config, f, indent=2)
    weights = os.path.join(path, WEIGHTS_FILE)
    save_file(tensors, weights, metadata={"format": "pt"})
    # safetensors writes through a private temp file (mode 0600); give it a normal file's mode.
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(weights, 0o666 & ~umask)
    if tokenizer is not None:
        tokenizer.save_pretrained(path)
