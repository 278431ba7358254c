"""Checkpoint fuzzing: random byte flips, truncations and deletions in any file of a run's
newest checkpoint step (or of `initial/` and `model.json`), then the trainer's restore.

Outcomes per case:
  intact      the damaged step still restored, every value equal to what was saved (the damage
              hit bytes nothing reads, e.g. a commit marker's text);
  fell_back   step 1 restored with a warning, values equal to step 1's, the damaged step moved
              aside — and that step really was damaged (read back raw, something differs);
  error       a one-line CheckpointCorruptError / CheckpointMismatchError (nothing moved).
Anything else — wrong values, a fallback without a warning, a valid step moved aside, another
exception or a multi-line message — is a failure.
"""

from __future__ import annotations

import json
import logging
import random
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax
import numpy as np
import optax
from flax import nnx

from sagc_jax import checkpoint as ckpt

STEPS = (1, 2)
_PROMPTS = [{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(4)]


@dataclass
class Saved:
    """A pristine checkpoints/ dir and what each of its steps holds."""

    dir: Path
    mcfg: Any
    template: Callable[[], ckpt.Snapshot]
    params: dict[int, Any]
    initial: Any
    data_state: dict[int, Any]


def make_saved(root: Path) -> Saved:
    """checkpoints/ with `initial` and steps 1, 2 (distinct params, SAGC state and data
    positions) from a tiny model, as `tests/test_checkpoint.py` builds it."""
    from sagc_jax.config import config_from_dict
    from sagc_jax.data.pipeline import make_prompt_iterator
    from sagc_jax.data.tokenizer import load_tokenizer
    from sagc_jax.models.build import build_model

    d = root / "checkpoints"
    cfg = config_from_dict({"model": {"hidden_size": 32, "intermediate_size": 64,
                                      "num_layers": 2, "num_heads": 4, "num_kv_heads": 2}})
    tok = load_tokenizer(None)
    model, mcfg = build_model(cfg, len(tok), tok, None)
    _, params = nnx.split(model)
    opt = optax.adam(1e-3)
    it = make_prompt_iterator(_PROMPTS, tokenizer=tok)
    saver = ckpt.RunCheckpointer(d, every=1, keep=5, async_save=False)
    saver.save_initial(params, mcfg)
    by_step, data_state = {}, {}
    for step in STEPS:
        next(it)  # a different data position per step
        p = jax.tree.map(lambda x, s=step: x + 0.01 * s, params)
        saver.save(step, ckpt.Snapshot(step, p, opt.init(p), {"q": np.full(3, step, np.float64)},
                                       it), force=True)
        by_step[step] = jax.tree.map(np.asarray, nnx.to_pure_dict(p))
        data_state[step] = it.get_state()
    saver.wait()
    saver.close()

    def template() -> ckpt.Snapshot:
        return ckpt.Snapshot(0, params, opt.init(params), {"q": np.zeros(3)},
                             make_prompt_iterator(_PROMPTS, tokenizer=tok))

    return Saved(d, mcfg, template, by_step, params, data_state)


def _equal(a: Any, b: Any) -> bool:
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    return len(la) == len(lb) and all(
        np.asarray(x).shape == np.asarray(y).shape
        and np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(la, lb, strict=True))


def _raw_intact(step_dir: Path, pristine: Path) -> bool:
    """Whether a damaged step still reads back exactly as the pristine copy (plain Orbax, no
    fingerprints): the oracle for "a step moved aside was really damaged"."""
    import orbax.checkpoint as ocp

    def read(d: Path) -> Any:
        with ocp.PyTreeCheckpointer() as c:
            items = {k: c.restore(d / k) for k in ("params", "opt_state", "sagc")}
        items["meta"] = json.loads((d / "meta" / "metadata").read_text())
        items["data"] = json.loads((d / "data" / "process_0-of-1.json").read_text())
        return items

    try:
        got = read(step_dir)
    except Exception:  # any failure to read means damaged
        return False
    want = read(pristine)
    return got["meta"] == want["meta"] and got["data"] == want["data"] and all(
        _equal(got[k], want[k]) for k in ("params", "opt_state", "sagc"))


class _Warnings(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def damage(rng: random.Random, path: Path) -> str:
    """Flips bits, truncates or deletes `path`; returns what was done."""
    data = path.read_bytes()
    kind = rng.choice(["flip", "flip", "truncate", "delete"])
    if kind == "flip" and data:
        buf = bytearray(data)
        for _ in range(rng.choice([1, 1, 4, 64])):
            buf[rng.randrange(len(buf))] ^= 1 << rng.randrange(8)
        path.write_bytes(bytes(buf))
    elif kind == "truncate":
        path.write_bytes(data[: rng.randrange(len(data))] if data else b"")
    else:
        path.unlink()
        kind = "delete"
    return kind


def _files(saved: Saved) -> list[Path]:
    """Every file of the newest step, `initial/` and `model.json` (relative to checkpoints/)."""
    d = saved.dir
    out = [p for p in (d / str(STEPS[-1])).rglob("*") if p.is_file()]
    out += [p for p in (d / "initial").rglob("*") if p.is_file()]
    out += [d / "initial.checksums.json", d / "model.json"]
    return sorted(p.relative_to(d) for p in out)


def check_case(saved: Saved, work: Path, rel: Path, rng: random.Random) -> tuple[str, str]:
    """Damage one file of a fresh copy, restore; returns (damage kind, outcome) or raises
    AssertionError describing a failure."""
    d = work / "checkpoints"
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(saved.dir, d)
    kind = damage(rng, d / rel)
    ck = ckpt.RunCheckpointer(d, every=1, keep=5, async_save=False)
    log = logging.getLogger("sagc_jax")
    handler = _Warnings()
    log.addHandler(handler)
    try:
        if rel.parts[0].startswith("initial"):
            try:
                got = ck.restore_initial(saved.initial)
            except ckpt.CheckpointCorruptError as e:
                assert "\n" not in str(e), f"multi-line error: {e!s:.300}"
                return kind, "error"
            assert _equal(nnx.to_pure_dict(got), nnx.to_pure_dict(saved.initial)), \
                "initial params restored with wrong values"
            return kind, "intact"
        template = saved.template()
        try:
            state = ck.restore_latest(template, saved.mcfg)
        except (ckpt.CheckpointCorruptError, ckpt.CheckpointMismatchError) as e:
            assert "\n" not in str(e), f"multi-line error: {e!s:.300}"
            moved = [p.name for p in d.iterdir() if ckpt.CORRUPT_TAG in p.name]
            assert not moved, f"error but steps were moved: {moved}"
            return kind, "error"
        except Exception as e:  # what we look for
            raise AssertionError(f"{type(e).__name__}: {e!s:.300}") from e
        finally:
            ck.close()
        assert state is not None, "no checkpoint found at all"
        assert _equal(nnx.to_pure_dict(state.params), saved.params[state.step]), \
            f"step {state.step} restored with wrong params"
        assert np.array_equal(state.sagc["q"], np.full(3, state.step)), "wrong SAGC state"
        assert template.data_iter.get_state() == saved.data_state[state.step], \
            "wrong data position"
        if state.step == STEPS[-1]:
            return kind, "intact"
        assert any("falling back" in m for m in handler.lines), "fell back without a warning"
        moved = [p for p in d.iterdir() if ckpt.CORRUPT_TAG in p.name]
        assert len(moved) == 1, f"moved aside: {moved}"
        assert not _raw_intact(moved[0], saved.dir / str(STEPS[-1])), \
            "a valid step was moved aside"
        return kind, "fell_back"
    finally:
        log.removeHandler(handler)


@dataclass
class CkptFuzzResult:
    """Counts of a checkpoint fuzz run; `failures` holds (case index, file, problem)."""

    tried: int = 0
    outcomes: Counter = field(default_factory=Counter)
    by_item: Counter = field(default_factory=Counter)
    failures: list[tuple[int, str, str]] = field(default_factory=list)


def run_ckpt_fuzz(n: int, seed: int = 0, saved: Saved | None = None) -> CkptFuzzResult:
    """`n` cases, cycling over every file so each is damaged at least once when n >= files."""
    rng = random.Random(seed)
    res = CkptFuzzResult()
    with tempfile.TemporaryDirectory() as tmp:
        saved = saved or make_saved(Path(tmp) / "pristine")
        files = _files(saved)
        order = files * (n // len(files)) + rng.sample(files, n % len(files))
        for i, rel in enumerate(order[:n]):
            item = rel.parts[1] if rel.parts[0].isdigit() and len(rel.parts) > 2 else rel.parts[0]
            try:
                kind, out = check_case(saved, Path(tmp) / "work", rel, rng)
            except AssertionError as e:
                res.failures.append((i, str(rel), str(e)))
                kind, out = "?", "failure"
            res.tried += 1
            res.outcomes[f"{kind}:{out}"] += 1
            res.by_item[f"{item}:{out}"] += 1
    return res
