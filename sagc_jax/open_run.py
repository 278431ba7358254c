"""One way to open a run: what a path holds, and the params a run's checkpoints restore to.

Train, eval, export and the dry run open runs only through here and `models.build` (which
model a config describes: `model_config`, `describe_model`):

- `resolve_checkpoint(path) -> PolicySource`: a run directory (`config.yaml` + `checkpoints/`:
  its newest step, or before the first step was saved `checkpoints/initial`, the params right
  after the SFT warm start), a run's `checkpoints/` directory, one step directory
  `.../checkpoints/<step>` (or `.../checkpoints/initial`), or a Hugging Face model directory
  (`config.json` + safetensors, e.g. a base model or the output of `sagc-jax export`, which
  carries the run config as `sagc_jax_config.yaml`);
- `restore_step_params(ckpt_dir, step, template)`: the params of a step (or `initial`), a LoRA
  run's adapters merged with its frozen base by `with_frozen_base`, which the trainer's resume
  uses too;
- `load_policy(path) -> (model, tokenizer, config)`: eval and export. Only the `params` item of
  a checkpoint is read (no optimizer state), into the abstract model the run's `config.yaml`
  describes; a damaged newest step falls back to older ones and then `initial`, as the
  trainer's resume does (`checkpoint.first_restorable`), but nothing is moved (readers take no
  run lock).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import jax
from flax import nnx
from jax.sharding import Mesh, SingleDeviceSharding

from sagc_jax import checkpoint as ckpt
from sagc_jax.config import Config, load_saved_config
from sagc_jax.data.tokenizer import load_run_tokenizer, load_tokenizer
from sagc_jax.models import Transformer, from_pretrained
from sagc_jax.models.build import model_config
from sagc_jax.models.config import ModelConfig
from sagc_jax.models.lora import checkpointed, has_lora, with_base
from sagc_jax.models.sharding import state_shardings

__all__ = [
    "CONFIG_IN_HF_DIR",
    "CheckpointPathError",
    "PolicySource",
    "load_policy",
    "resolve_checkpoint",
    "restore_step_params",
    "with_frozen_base",
]

#: The run config an exported HF directory carries (eval defaults: data, rewards, sampling).
CONFIG_IN_HF_DIR = "sagc_jax_config.yaml"
_RUN_CONFIG = "config.yaml"
_CKPT_DIR = "checkpoints"
_HF_WEIGHTS = ("model.safetensors", "model.safetensors.index.json")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


class CheckpointPathError(ValueError):
    """A path is not a run, checkpoint or HF model directory (the message names the path)."""


@dataclasses.dataclass(frozen=True)
class PolicySource:
    """What a checkpoint path resolved to.

    kind: "orbax" (a CheckpointManager step), "initial" (`checkpoints/initial`) or "hf".
    path: the HF directory, the step directory or the `initial` directory.
    run_dir: the run directory holding `config.yaml` (None for an HF directory).
    step: the step number for "orbax", else None.
    """

    kind: str
    path: Path
    run_dir: Path | None = None
    step: int | None = None


# ----------------------------------------------------------------------------- resolution


def _is_hf_dir(p: Path) -> bool:
    return (p / "config.json").is_file() and any((p / w).is_file() for w in _HF_WEIGHTS)


def _steps(ckpt_dir: Path) -> list[int]:
    """Finished CheckpointManager steps (Orbax writes `<step>.orbax-checkpoint-tmp-*` first and
    renames on commit, so a plain integer name is a committed step)."""
    if not ckpt_dir.is_dir():
        return []
    return sorted(int(d.name) for d in ckpt_dir.iterdir() if d.is_dir() and d.name.isdigit())


def _from_checkpoints_dir(ckpt_dir: Path, run_dir: Path) -> PolicySource:
    steps = _steps(ckpt_dir)
    if steps:
        return PolicySource("orbax", ckpt_dir / str(steps[-1]), run_dir, steps[-1])
    if (ckpt_dir / ckpt.INITIAL).is_dir():
        return PolicySource("initial", ckpt_dir / ckpt.INITIAL, run_dir)
    raise CheckpointPathError(f"{ckpt_dir} holds no checkpoint steps (and no '{ckpt.INITIAL}')")


def _need_config(run_dir: Path, what: Path) -> Path:
    if not (run_dir / _RUN_CONFIG).is_file():
        raise CheckpointPathError(f"{what} looks like a checkpoint but {run_dir / _RUN_CONFIG} "
                                  "(the run config that describes the model) is missing")
    return run_dir


def resolve_checkpoint(checkpoint: str | os.PathLike[str]) -> PolicySource:
    """Classifies `checkpoint` (see the module docstring); `CheckpointPathError` if it is none
    of the accepted kinds or does not exist."""
    p = Path(checkpoint).expanduser().absolute()
    if not p.exists():
        raise CheckpointPathError(f"checkpoint path {p} does not exist")
    if not p.is_dir():
        raise CheckpointPathError(f"checkpoint path {p} is not a directory")
    if _is_hf_dir(p):
        return PolicySource("hf", p)
    if (p / _RUN_CONFIG).is_file() and (p / _CKPT_DIR).is_dir():  # (a) a run directory
        return _from_checkpoints_dir(p / _CKPT_DIR, p)
    if p.name.isdigit() and (p / "params").is_dir():  # (c) one step directory
        return PolicySource("orbax", p, _need_config(p.parent.parent, p), int(p.name))
    if p.name == ckpt.INITIAL and (p.parent / "model.json").is_file():
        return PolicySource("initial", p, _need_config(p.parent.parent, p))
    if _steps(p) or (p / "model.json").is_file():  # (b) a run's checkpoints/ directory
        return _from_checkpoints_dir(p, _need_config(p.parent, p))
    raise CheckpointPathError(
        f"{p} is not a run directory (config.yaml + checkpoints/), a checkpoints/ or step "
        "directory, nor a Hugging Face model directory (config.json + model.safetensors)")


# ----------------------------------------------------------------------------- params


def with_frozen_base(ckpt_dir: Path, params: Any, template: Any) -> Any:
    """A run checkpoint's params (`lora.checkpointed`: a LoRA run's steps hold only the
    adapters) as the whole model's: for a LoRA run the frozen base is read from
    `<ckpt_dir>/initial` (placed like `template`, the whole model's nnx.State) and the adapters
    put in; other runs' params are returned as they are. The trainer's resume and eval /
    export both merge here."""
    if not has_lora(template):
        return params
    return with_base(params, ckpt.restore_params(Path(ckpt_dir) / ckpt.INITIAL, template))


def restore_step_params(ckpt_dir: Path, step: int | None, template: Any) -> Any:
    """The whole model's params at checkpoint `step` of `ckpt_dir` (None: `initial`), placed
    like `template` (an nnx.State of arrays or of ShapeDtypeStructs with shardings) and
    verified against the saved fingerprints."""
    if step is None:
        return ckpt.restore_params(Path(ckpt_dir) / ckpt.INITIAL, template)
    saved = ckpt.restore_params(ckpt_dir, checkpointed(template), step=step)
    return with_frozen_base(ckpt_dir, saved, template)


def _run_template(cfg: Config, tokenizer: Any,
                  mesh: Mesh | None) -> tuple[ModelConfig, nnx.GraphDef, Any]:
    """(architecture, graphdef, abstract params placed on `mesh` or the first local device) of
    the model `build_model` builds for `cfg`: nothing is allocated."""
    try:
        mcfg = model_config(cfg, len(tokenizer), tokenizer)  # the trainer's recipe
    except OSError as e:
        raise CheckpointPathError(
            f"the run was initialised from {cfg.model.path}, whose config.json (needed to know "
            f"the architecture) cannot be read: {e.strerror}") from None
    graphdef, state = nnx.split(nnx.eval_shape(
        lambda: Transformer(mcfg, rngs=nnx.Rngs(cfg.run.seed))))
    if mesh is not None:
        shardings = state_shardings(state, mesh)
    else:
        one = SingleDeviceSharding(jax.local_devices()[0])
        shardings = jax.tree.map(lambda _: one, state)
    return mcfg, graphdef, jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), state, shardings)


def _candidates(src: PolicySource, named: Path) -> list[PolicySource]:
    """What to try, in order: `src`, then, when `named` is a run or checkpoints dir (not one
    step), the older steps and `initial` (as training falls back past a damaged step)."""
    if src.kind != "orbax" or named == src.path:
        return [src]
    ckpt_dir = src.path.parent
    older = [PolicySource("orbax", ckpt_dir / str(s), src.run_dir, s)
             for s in reversed(_steps(ckpt_dir)) if s < (src.step or 0)]
    initial = ([PolicySource("initial", ckpt_dir / ckpt.INITIAL, src.run_dir)]
               if (ckpt_dir / ckpt.INITIAL).is_dir() else [])
    return [src, *older, *initial]


def _restore_run_params(src: PolicySource, named: Path, template: Any) -> Any:
    """`restore_step_params` of the newest restorable candidate (`_candidates`). Read-only:
    damaged steps are reported, not moved (training moves them aside, under the run lock)."""
    candidates = _candidates(src, named)
    params, bad = ckpt.first_restorable(
        candidates, lambda c: restore_step_params(c.path.parent, c.step, template),
        lambda c: str(c.path))
    if params is not None:
        return params
    first = f"{bad[0][0].path}: {bad[0][1]}"
    if len(candidates) == 1:
        raise ckpt.CheckpointCorruptError(f"checkpoint {first}")
    raise ckpt.CheckpointCorruptError(f"no checkpoint in {src.path.parent} could be restored "
                                      f"(newest: {first})")


def _hf_tokenizer(path: Path, cfg: Config | None) -> Any:
    """The HF directory's own tokenizer if it has one, else the run's / the packaged one."""
    if any((path / f).is_file() for f in _TOKENIZER_FILES):
        return load_tokenizer(path)
    return load_tokenizer(cfg.model.tokenizer if cfg is not None else None)


def load_policy(
    checkpoint: str | os.PathLike[str],
    *,
    tokenizer: Any = None,
    mesh: Mesh | None = None,
) -> tuple[Transformer, Any, Config | None]:
    """Loads a policy for evaluation or export.

    Args:
      checkpoint: a run directory, its `checkpoints/` directory, a step directory or an HF model
        directory (see the module docstring).
      tokenizer: overrides the tokenizer (default: the run's `model.tokenizer`, or the HF
        directory's own, or the packaged char-level one).
      mesh: place params with `state_shardings` on this mesh; default: the first local device.

    Returns:
      `(model, tokenizer, cfg)`; `cfg` is the run's resolved Config, or None for an HF directory
      that carries none.

    Raises:
      CheckpointPathError: the path is missing or not one of the accepted kinds (names it).
      CheckpointMismatchError: the checkpoint was written for a different model than the
        run's config.yaml describes.
      CheckpointCorruptError: no candidate restores (a step named explicitly: that step).
    """
    src = resolve_checkpoint(checkpoint)
    if src.kind == "hf":
        cfg_path = src.path / CONFIG_IN_HF_DIR
        cfg = load_saved_config(cfg_path) if cfg_path.is_file() else None
        model, mcfg = from_pretrained(src.path, mesh=mesh)
        tok = tokenizer if tokenizer is not None else _hf_tokenizer(src.path, cfg)
    else:
        assert src.run_dir is not None
        cfg = load_saved_config(src.run_dir / _RUN_CONFIG)
        tok = (tokenizer if tokenizer is not None
               else load_run_tokenizer(cfg.model.tokenizer, cfg.model.path))
        mcfg, graphdef, template = _run_template(cfg, tok, mesh)
        # model.json (written beside the steps) names any mismatch with config.yaml clearly,
        # before Orbax fails on a shape.
        ckpt.RunCheckpointer(src.path.parent, every=0, keep=1).check_model(mcfg)
        params = _restore_run_params(src, Path(checkpoint).expanduser().absolute(), template)
        model = nnx.merge(graphdef, params)
    if mcfg.vocab_size < len(tok):
        raise ValueError(f"model vocab_size {mcfg.vocab_size} is smaller than the tokenizer's "
                         f"{len(tok)} tokens (wrong tokenizer for {src.path}?)")
    return model, tok, cfg
