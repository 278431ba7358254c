"""Orbax checkpoints of a run: params, optimizer, SAGC state, grain iterator, step.

Layout under `<run_dir>/checkpoints/`:
    <step>/            CheckpointManager steps (async, `keep` newest)
        params/ opt_state/ sagc/ data/ meta/
    initial/           params right after the SFT warm start (the KL reference; read, not copied)

PRNG keys are derived from (run.seed, step), so the step *is* the RNG state. A newest checkpoint
that fails to restore (truncated, corrupt) is reported and the previous one is used; a checkpoint
of a different model shape is an error naming the mismatch, never a silent fallback.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
from pathlib import Path
from typing import Any

import grain
import jax
import numpy as np
import orbax.checkpoint as ocp
from flax import nnx

from sagc_jax.models.config import ModelConfig

logger = logging.getLogger(__name__)


class CheckpointMismatchError(ValueError):
    """A checkpoint exists but belongs to an incompatible configuration."""


@dataclasses.dataclass
class Snapshot:
    """Everything a checkpoint step holds (the live `train.state.TrainState` plus the SAGC
    state and the data position)."""

    step: int
    params: Any  # nnx.State of the model
    opt_state: Any
    sagc: dict[str, np.ndarray]
    data_iter: Any  # grain DatasetIterator, or a list of them (one per owned data shard);
    # restored in place


def _data_items(data_iter: Any) -> dict[str, Any]:
    """Checkpoint item name -> iterator: ``data`` for the first (the single-shard layout of
    older checkpoints), ``data_1``, ``data_2``... for further shards this process owns. grain
    writes one file per process in each item, so each process restores its own shards."""
    iters = list(data_iter) if isinstance(data_iter, (list, tuple)) else [data_iter]
    return {("data" if i == 0 else f"data_{i}"): it for i, it in enumerate(iters)}


def _model_signature(cfg: ModelConfig) -> dict[str, Any]:
    keys = ("model_type", "vocab_size", "hidden_size", "intermediate_size", "num_layers",
            "num_heads", "num_kv_heads", "head_dim", "tie_word_embeddings", "qkv_bias", "o_bias",
            "mlp_bias")
    return {k: getattr(cfg, k) for k in keys}


def _pure(params: Any) -> dict:
    return nnx.to_pure_dict(params) if isinstance(params, nnx.State) else params


def _flat(tree: Any) -> dict[str, Any]:
    """Optimizer states are nested optax tuples holding nnx.States: store leaves by index so the
    on-disk format does not depend on those classes; the live tree supplies the structure."""
    return {str(i): x for i, x in enumerate(jax.tree.leaves(tree))}


def _abstract(tree: Any) -> Any:
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                        tree)


def restore_params(path: str | Path, template: Any) -> Any:
    """Params saved by `RunCheckpointer.save_initial` (or any Orbax pure-dict params dir),
    placed like `template` (an nnx.State); shape mismatches are errors naming the param."""
    path = Path(path).absolute()
    if not path.exists():
        raise FileNotFoundError(f"init.params: {path} does not exist")
    pure = restore_pure_params(path, _abstract(_pure(template)))
    out = jax.tree.map(lambda x: x, template)
    nnx.replace_by_pure_dict(out, pure)
    return out


def restore_pure_params(path: str | Path, target: Any, step: int | None = None) -> Any:
    """Pure-dict params placed as `target` (ShapeDtypeStructs with shardings): from an
    `initial`-style directory (`step=None`) or the `params` item of CheckpointManager step
    `step` in directory `path` (the optimizer state and the rest are not read)."""
    if step is None:
        with ocp.StandardCheckpointer() as c:
            return c.restore(Path(path).absolute(), target)
    mngr = ocp.CheckpointManager(Path(path).absolute(),
                                 options=ocp.CheckpointManagerOptions(create=False))
    try:
        got = mngr.restore(step, args=ocp.args.Composite(params=ocp.args.StandardRestore(target)))
    finally:
        mngr.close()
    return got["params"]


class RunCheckpointer:
    """A CheckpointManager with the run's save policy, fallback restore and the initial params."""

    def __init__(self, directory: str | Path, *, every: int, keep: int, async_save: bool = True):
        self.directory = Path(directory).absolute()
        self.every = every
        self.keep = keep
        self.async_save = async_save
        self._mngr: ocp.CheckpointManager | None = None

    @property
    def manager(self) -> ocp.CheckpointManager:
        if self._mngr is None:
            self._mngr = ocp.CheckpointManager(
                self.directory,
                options=ocp.CheckpointManagerOptions(
                    max_to_keep=self.keep, create=True,
                    enable_async_checkpointing=self.async_save))
        return self._mngr

    # -------------------------------------------------------------- before training
    def check_writable(self, min_free_bytes: int = 0) -> None:
        """Fails before step 1 (not after hours) when checkpoints cannot be written."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            # One probe per process: hosts sharing run.dir must not unlink each other's.
            probe = self.directory / f".write_probe.{jax.process_index()}"
            probe.write_bytes(b"x" * 1024)
            probe.unlink()
        except OSError as e:
            raise OSError(f"checkpoint directory {self.directory} is not writable: {e}") from e
        free = shutil.disk_usage(self.directory).free
        if free < min_free_bytes:
            raise OSError(f"checkpoint directory {self.directory} has {free / 2**20:.0f} MiB free,"
                          f" a checkpoint needs about {min_free_bytes / 2**20:.0f} MiB")

    # -------------------------------------------------------------- save
    def save(self, step: int, state: Snapshot, *, force: bool = False) -> bool:
        if not force and (self.every == 0 or step % self.every):
            return False
        if step in self.manager.all_steps():
            return False
        data = _data_items(state.data_iter)
        meta = {"step": step, "sagc_keys": sorted(state.sagc), "data_items": len(data)}
        args = ocp.args.Composite(
            params=ocp.args.StandardSave(_pure(state.params)),
            opt_state=ocp.args.StandardSave(_flat(state.opt_state)),
            sagc=ocp.args.StandardSave({k: np.asarray(v) for k, v in state.sagc.items()}),
            meta=ocp.args.JsonSave(meta),
            **{k: grain.checkpoint.CheckpointSave(it) for k, it in data.items()},
        )
        return self.manager.save(step, args=args, force=True)

    def save_initial(self, params: Any, model_cfg: ModelConfig) -> None:
        """Params after the SFT warm start: the KL reference, re-read on resume (one copy)."""
        path = self.directory / "initial"
        if path.exists():
            shutil.rmtree(path)
        with ocp.StandardCheckpointer() as c:
            c.save(path, _pure(params))
        if jax.process_index() == 0:
            (self.directory / "model.json").write_text(
                json.dumps(_model_signature(model_cfg), indent=1))

    def restore_initial(self, template: Any) -> Any:
        return restore_params(self.directory / "initial", template)

    def wait(self) -> None:
        if self._mngr is not None:
            self._mngr.wait_until_finished()

    def close(self) -> None:
        """Waits for pending saves and releases the manager (its threads and files)."""
        if self._mngr is not None:
            self._mngr.wait_until_finished()
            self._mngr.close()
            self._mngr = None

    def latest_step(self) -> int | None:
        if not self.directory.exists():
            return None
        return self.manager.latest_step()

    # -------------------------------------------------------------- restore
    def check_model(self, model_cfg: ModelConfig) -> None:
        path = self.directory / "model.json"
        if not path.exists():
            return
        saved = json.loads(path.read_text())
        now = _model_signature(model_cfg)
        diff = {k: (saved.get(k), v) for k, v in now.items() if saved.get(k) != v}
        if diff:
            what = ", ".join(f"{k}: checkpoint {a} vs config {b}" for k, (a, b) in diff.items())
            raise CheckpointMismatchError(
                f"checkpoints in {self.directory} were written for a different model ({what}); "
                "use another run.dir or the original model config")

    def restore_latest(self, template: Snapshot, model_cfg: ModelConfig) -> Snapshot | None:
        """Newest restorable checkpoint, falling back past damaged ones; None if there is none."""
        if self.latest_step() is None:
            return None
        self.check_model(model_cfg)
        for step in sorted(self.manager.all_steps(), reverse=True):
            try:
                return self._restore(step, template)
            except CheckpointMismatchError:
                raise
            except Exception as e:
                logger.warning("checkpoint step %d in %s is unreadable (%s: %s); falling back "
                               "to the previous one", step, self.directory, type(e).__name__,
                               str(e).splitlines()[0][:200])
        raise FileNotFoundError(f"no checkpoint in {self.directory} could be restored")

    def _restore(self, step: int, template: Snapshot) -> Snapshot:
        pure_t = _pure(template.params)
        flat_opt = _flat(template.opt_state)
        sagc_t = {k: np.asarray(v) for k, v in template.sagc.items()}
        meta = self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
        missing = set(sagc_t) - set(meta["meta"]["sagc_keys"])
        if missing:
            raise CheckpointMismatchError(
                f"checkpoint step {step}: SAGC state lacks {sorted(missing)}")
        data = _data_items(template.data_iter)
        saved_items = meta["meta"].get("data_items", 1)
        if saved_items != len(data):
            raise CheckpointMismatchError(
                f"checkpoint step {step}: written with {saved_items} data shard(s) per process, "
                f"this run has {len(data)} (data.shards / process count changed)")
        got = self.manager.restore(step, args=ocp.args.Composite(
            params=ocp.args.StandardRestore(_abstract(pure_t)),
            opt_state=ocp.args.StandardRestore(_abstract(flat_opt)),
            sagc=ocp.args.StandardRestore(sagc_t),
            **{k: grain.checkpoint.CheckpointRestore(it) for k, it in data.items()},
        ))
        params = jax.tree.map(lambda x: x, template.params)
        nnx.replace_by_pure_dict(params, got["params"])
        treedef = jax.tree.structure(template.opt_state)
        opt_state = jax.tree.unflatten(treedef, [got["opt_state"][str(i)]
                                                 for i in range(len(flat_opt))])
        sagc = {k: np.asarray(v) for k, v in got["sagc"].items()}
        return Snapshot(step=step, params=params, opt_state=opt_state, sagc=sagc,
                          data_iter=template.data_iter)
