"""Orbax checkpoints of a run: params, optimizer, SAGC state, grain iterator, step.

Layout under `<run_dir>/checkpoints/`:
    <step>/            CheckpointManager steps (async, `keep` newest)
        params/ opt_state/ sagc/ data/ meta/
    initial/           params right after the SFT warm start (the KL reference; read, not copied)

PRNG keys are derived from (run.seed, step), so the step *is* the RNG state.

Integrity: every save stores a fingerprint of each saved array (`checksum.py`) in the step's
`meta` item (and `initial.checksums.json` beside `initial/`); restore recomputes and compares
them, so flipped bits are an error rather than silently wrong weights. A step that fails to
restore because its files are damaged (`integrity_failure`: a fingerprint mismatch, bytes that do
not decode, a missing file) is reported, the previous step is used, and once an older step has
restored the bad one is renamed `<step>.corrupt-<UTC time>`: the fallback does not repeat on every
rerun and the step number can be saved again. Any other failure while reading (out of memory, an
I/O error, a full disk, Ctrl-C) says nothing about the files: it is raised as it is and nothing is
moved. A checkpoint of a different model shape is an error naming the mismatch, never a fallback.
Those verified reads and the fallback are `restore.py`'s (re-exported here).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import grain
import jax
import numpy as np
import orbax.checkpoint as ocp
from flax import nnx

from sagc_jax.checksum import fingerprints, fingerprints_np
from sagc_jax.models.config import ModelConfig

# Re-exported: callers read a checkpoint's files through `checkpoint` (`restore.py` has them).
from sagc_jax.restore import CHECKSUMS_SUFFIX as CHECKSUMS_SUFFIX
from sagc_jax.restore import CheckpointCorruptError as CheckpointCorruptError
from sagc_jax.restore import CheckpointMismatchError as CheckpointMismatchError
from sagc_jax.restore import _abstract as _abstract
from sagc_jax.restore import _checksums_file as _checksums_file
from sagc_jax.restore import _pure as _pure
from sagc_jax.restore import _quiet_orbax_unraisable as _quiet_orbax_unraisable
from sagc_jax.restore import _unreadable as _unreadable
from sagc_jax.restore import error_line as error_line
from sagc_jax.restore import first_restorable as first_restorable
from sagc_jax.restore import integrity_failure as integrity_failure
from sagc_jax.restore import restore_params as restore_params
from sagc_jax.restore import restore_pure_params as restore_pure_params
from sagc_jax.restore import verify as verify
from sagc_jax.restore import warn as warn

CORRUPT_TAG = ".corrupt-"
INITIAL = "initial"  # `checkpoints/initial`: the params before step 1 (the KL reference)


def format_bytes(n: float) -> str:
    """1536 -> '1.5 KiB': human sizes that never round a real size down to '0 MiB'."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" or n >= 100 else f"{n:.3g} {unit}"
        n /= 1024
    raise AssertionError  # unreachable


def tree_bytes(tree: Any) -> int:
    return int(sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree)))


def _nested(tree: Any) -> Any:
    """The SAGC state as the nested dict a checkpoint holds (sub-model -> key -> numpy array).

    A typed state (NamedTuples, ``sagc_jax.sagc.state.SAGCState``) becomes dicts by field name,
    so the files keep the layout written before the state was typed and old checkpoints read
    back; a dict is kept as a dict. ``policy.load_state`` turns the restored dict back into the
    typed state."""
    if isinstance(tree, dict):
        return {k: _nested(v) for k, v in tree.items()}
    if isinstance(tree, tuple) and hasattr(tree, "_asdict"):
        return {k: _nested(v) for k, v in tree._asdict().items()}
    return np.asarray(tree)


def _sagc_keys(sagc: dict[str, Any]) -> list[str]:
    """The SAGC state's leaves as ``sub/key`` paths (its nested dict, ``_nested``), sorted."""
    out: list[str] = []
    for m, sub in sagc.items():
        out += [f"{m}/{k}" for k in sub] if isinstance(sub, dict) else [str(m)]
    return sorted(out)


@dataclasses.dataclass
class Snapshot:
    """Everything a checkpoint step holds: a `train.state.RunState` (params, optimizer and SAGC
    state, step) with the data iterators its position is read from and restored into."""

    step: int
    params: Any  # nnx.State of the model
    opt_state: Any
    sagc: Any  # the SAGC state (typed SAGCState, or sub-model -> its arrays); restored: a dict
    data_iter: Any  # grain DatasetIterator, or a list of them (one per owned data shard);
    # restored in place


def _data_items(data_iter: Any) -> dict[str, Any]:
    """Checkpoint item name -> iterator: ``data`` for the first (the single-shard layout of
    older checkpoints), ``data_1``, ``data_2``... for further shards this process owns. grain
    writes one file per process in each item, so each process restores its own shards."""
    iters = list(data_iter) if isinstance(data_iter, (list, tuple)) else [data_iter]
    return {("data" if i == 0 else f"data_{i}"): it for i, it in enumerate(iters)}


def _data_states(data: dict[str, Any]) -> list[str] | None:
    """The iterators' positions as JSON text, stored in `meta` so a damaged `data` item that
    still parses (a flipped digit) is caught on restore. Single-process runs only: `meta` is
    written by process 0, and other processes hold other shards."""
    if jax.process_count() > 1:
        return None
    return [json.dumps(it.get_state(), sort_keys=True, default=str) for it in data.values()]


def _model_signature(cfg: ModelConfig) -> dict[str, Any]:
    keys = ("model_type", "vocab_size", "hidden_size", "intermediate_size", "num_layers",
            "num_heads", "num_kv_heads", "head_dim", "tie_word_embeddings", "qkv_bias", "o_bias",
            "mlp_bias")
    return {k: getattr(cfg, k) for k in keys}


def _flat(tree: Any) -> dict[str, Any]:
    """Optimizer states are nested optax tuples holding nnx.States: store leaves by index so the
    on-disk format does not depend on those classes; the live tree supplies the structure."""
    return {str(i): x for i, x in enumerate(jax.tree.leaves(tree))}


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
            raise OSError(f"run.dir: checkpoint directory {self.directory} is not writable: "
                          f"{e.strerror or e}") from None
        free = shutil.disk_usage(self.directory).free
        if free < min_free_bytes:
            raise OSError(f"run.dir: {self.directory} has {format_bytes(free)} free, this run "
                          f"needs about {format_bytes(min_free_bytes)}")

    def bytes_needed(self, params: Any, opt_state: Any, *, steps: int) -> tuple[int, str]:
        """(bytes the run will still write, how that was counted) for the disk pre-check.

        The CheckpointManager writes a step before deleting the oldest, so up to `keep + 1`
        checkpoints (params + optimizer state) exist at once, plus `initial/` (params). Steps and
        `initial/` already on disk are already paid for.
        """
        per_ckpt = tree_bytes(params) + tree_bytes(opt_state)
        saves = steps // self.every + 1 if self.every > 0 else 1  # + the final / signal save
        existing = len(self._step_dirs())
        count = max(min(self.keep + 1, saves) - existing, 0)
        initial = 0 if (self.directory / INITIAL).is_dir() else tree_bytes(params)
        how = (f"{count} checkpoint(s) of {format_bytes(per_ckpt)} (checkpoint.keep={self.keep}, "
               f"{existing} already saved) + {format_bytes(initial)} initial params")
        return count * per_ckpt + initial, how

    def check_space(self, params: Any, opt_state: Any, *, steps: int) -> None:
        """`check_writable` with the space the run really needs (see `bytes_needed`)."""
        need, how = self.bytes_needed(params, opt_state, steps=steps)
        try:
            self.check_writable(need)
        except OSError as e:
            if "free" not in str(e):
                raise
            raise OSError(f"{e} ({how}); free some space, lower checkpoint.keep or choose "
                          "another run.dir") from None

    # -------------------------------------------------------------- save
    def save(self, step: int, state: Snapshot, *, force: bool = False) -> bool:
        if not force and (self.every == 0 or step % self.every):
            return False
        if step in self.manager.all_steps():
            return False
        data = _data_items(state.data_iter)
        params, opt = _pure(state.params), _flat(state.opt_state)
        sagc = _nested(state.sagc)
        meta = {"step": step, "sagc_keys": _sagc_keys(sagc), "data_items": len(data),
                "data_states": _data_states(data),
                # Computed on device before the async write, from the same arrays it copies.
                "checksums": {"params": fingerprints(params), "opt_state": fingerprints(opt),
                              "sagc": fingerprints_np(sagc)}}
        args = ocp.args.Composite(
            params=ocp.args.StandardSave(params),
            opt_state=ocp.args.StandardSave(opt),
            sagc=ocp.args.StandardSave(sagc),
            meta=ocp.args.JsonSave(meta),
            **{k: grain.checkpoint.CheckpointSave(it) for k, it in data.items()},
        )
        return self.manager.save(step, args=args, force=True)

    def save_initial(self, params: Any, model_cfg: ModelConfig,
                     recipe: dict[str, Any] | None = None) -> None:
        """Params after the SFT warm start: the KL reference, re-read on resume (one copy).

        `recipe` (the settings that produced them) is stored beside the fingerprints, so a run
        killed before its first step reuses them instead of redoing the SFT (`initial_recipe`).
        """
        path = self.directory / INITIAL
        sums = _checksums_file(path)
        pure = _pure(params)
        digest = fingerprints(pure)
        if jax.process_index() == 0:
            sums.unlink(missing_ok=True)  # never pair new params with old checksums
        if path.exists():
            shutil.rmtree(path)
        with ocp.StandardCheckpointer() as c:
            c.save(path, pure)
        if jax.process_index() == 0:
            (self.directory / "model.json").write_text(
                json.dumps(_model_signature(model_cfg), indent=1))
            tmp = sums.with_suffix(".tmp")
            tmp.write_text(json.dumps({"params": digest, "recipe": recipe}))
            os.replace(tmp, sums)  # last: its presence marks `initial/` as complete

    def initial_recipe(self) -> dict[str, Any] | None:
        """The `recipe` saved with a complete `initial/` (None if there is none)."""
        sums = _checksums_file(self.directory / INITIAL)
        try:
            return json.loads(sums.read_text()).get("recipe")
        except (OSError, ValueError, AttributeError):
            return None

    def restore_initial(self, template: Any) -> Any:
        return restore_params(self.directory / INITIAL, template)

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

    def _step_dirs(self) -> list[int]:
        if not self.directory.is_dir():
            return []
        return sorted(int(p.name) for p in self.directory.iterdir()
                      if p.is_dir() and p.name.isdigit())

    # -------------------------------------------------------------- restore
    def check_model(self, model_cfg: ModelConfig) -> None:
        path = self.directory / "model.json"
        if not path.exists():
            return
        try:
            saved = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(saved, dict):
                raise ValueError(f"expected a JSON object, got {type(saved).__name__}")
        except (OSError, ValueError) as e:
            raise CheckpointCorruptError(
                f"{path} is unreadable ({error_line(e)}): it records the model the checkpoints "
                "were written for; restore it or delete it to skip this check") from None
        now = _model_signature(model_cfg)
        diff = {k: (saved.get(k), v) for k, v in now.items() if saved.get(k) != v}
        if diff:
            what = ", ".join(f"{k}: checkpoint {a} vs config {b}" for k, (a, b) in diff.items())
            raise CheckpointMismatchError(
                f"checkpoints in {self.directory} were written for a different model ({what}); "
                "use another run.dir or the original model config")

    def restore_latest(self, template: Snapshot, model_cfg: ModelConfig) -> Snapshot | None:
        """Newest restorable checkpoint, falling back past damaged ones; None if there is none.

        Damaged steps (`integrity_failure`) newer than the one restored are moved aside
        (`quarantine`). Any other error is raised at once with nothing moved. If no step
        restores, nothing is moved (the cause may be this run, not the files) and the first
        step's error is raised.
        """
        if self.latest_step() is None:
            return None
        self.check_model(model_cfg)
        state, bad = first_restorable(sorted(self.manager.all_steps(), reverse=True),
                                      lambda step: self._restore(step, template),
                                      lambda step: f"step {step} in {self.directory}")
        if state is None:
            raise CheckpointCorruptError(f"no checkpoint in {self.directory} could be restored "
                                         f"(step {bad[0][0]}: {bad[0][1]}); nothing was moved")
        if bad:
            self.quarantine([s for s, _ in bad])
        return state

    def quarantine(self, steps: list[int]) -> list[Path]:
        """Renames damaged steps to `<step>.corrupt-<UTC time>` (kept for inspection; Orbax
        ignores them), so the step can be saved again and the fallback does not repeat."""
        self.close()  # the manager caches its step list
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        moved = []
        if jax.process_index() == 0:
            for step in steps:
                src = self.directory / str(step)
                dest = self.directory / f"{step}{CORRUPT_TAG}{stamp}"
                os.replace(src, dest)
                moved.append(dest)
                warn(f"moved damaged checkpoint step {step} aside to {dest}")
        if jax.process_count() > 1:
            from jax.experimental import multihost_utils

            multihost_utils.sync_global_devices("sagc_jax_quarantine")
        return moved

    def _restore(self, step: int, template: Snapshot) -> Snapshot:
        pure_t = _pure(template.params)
        flat_opt = _flat(template.opt_state)
        sagc_t = _nested(template.sagc)
        where = f"checkpoint step {step} in {self.directory}"
        try:
            meta = self.manager.restore(
                step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
            if not isinstance(meta, dict) or not isinstance(meta.get("sagc_keys"), list):
                raise CheckpointCorruptError(f"{where}: meta is unreadable ({meta!r:.80})")
        except Exception as e:
            err = _unreadable(f"{where}: meta", e)
            if err is e:
                raise
            raise err from None
        saved_keys = [str(k) for k in meta["sagc_keys"]]
        missing = set(_sagc_keys(sagc_t)) - set(saved_keys)
        if missing and saved_keys and not any("/" in k for k in saved_keys):
            raise CheckpointMismatchError(
                f"checkpoint step {step}: SAGC state key {sorted(saved_keys)[0]!r} is from the "
                "old flat layout: the SAGC state layout changed in the controller core rewrite "
                "(issue 32); resume it with the version that wrote it, or start a new run.dir")
        if missing:
            raise CheckpointMismatchError(
                f"checkpoint step {step}: SAGC state lacks {sorted(missing)}")
        data = _data_items(template.data_iter)
        saved_items = meta.get("data_items", 1)
        if saved_items != len(data):
            raise CheckpointMismatchError(
                f"checkpoint step {step}: written with {saved_items} data shard(s) per process, "
                f"this run has {len(data)} (data.shards / process count changed)")
        try:
            got = self.manager.restore(step, args=ocp.args.Composite(
                params=ocp.args.StandardRestore(_abstract(pure_t)),
                opt_state=ocp.args.StandardRestore(_abstract(flat_opt)),
                sagc=ocp.args.StandardRestore(sagc_t),
                **{k: grain.checkpoint.CheckpointRestore(it) for k, it in data.items()},
            ))
        except Exception as e:  # undecodable bytes fail here, before the checksums can
            err = _unreadable(where, e)
            if err is e:
                raise
            raise err from None
        sums = meta.get("checksums") or {}
        verify(f"{where}: params", got["params"], sums.get("params"))
        verify(f"{where}: opt_state", got["opt_state"], sums.get("opt_state"))
        verify(f"{where}: sagc", jax.tree.map(np.asarray, got["sagc"]), sums.get("sagc"),
               host=True)
        params = jax.tree.map(lambda x: x, template.params)
        nnx.replace_by_pure_dict(params, got["params"])
        treedef = jax.tree.structure(template.opt_state)
        opt_state = jax.tree.unflatten(treedef, [got["opt_state"][str(i)]
                                                 for i in range(len(flat_opt))])
        states = meta.get("data_states")
        if states is not None and states != _data_states(data):
            raise CheckpointCorruptError(f"{where}: data iterator state differs from the one "
                                         "saved")
        sagc = jax.tree.map(np.asarray, got["sagc"])
        return Snapshot(step=step, params=params, opt_state=opt_state, sagc=sagc,
                        data_iter=template.data_iter)

