"""End-to-end training: run dir contents, 0 compiles after warm-up, exact resume after SIGKILL,
damaged checkpoints, incompatible configs, and bad input that fails loudly without losing state."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import orbax.checkpoint as ocp
import pytest
from xla_env import xla_flags

from sagc_jax.cli import main
from sagc_jax.config import load_config
from sagc_jax.config import sagc_constants as sc
from sagc_jax.metrics import TIMING_KEYS, read_jsonl

# A ~60k-param model on short arithmetic: compiles in seconds, and SAGC can move G between 2
# and 4 (timing: model keeps decisions reproducible, so resumed runs can be compared exactly).
TINY = [
    "model.hidden_size=32", "model.intermediate_size=64", "model.num_layers=2",
    "model.num_heads=2", "model.num_kv_heads=1", "data.task=arith_short", "data.task_max_steps=3",
    "data.prompts_per_step=4", "sagc.group_sizes=[2,4]", "sagc.initial_group_size=4",
    "sagc.warmup_steps=1", "sagc.timing=model", "sagc.straggler=group_ratio",
    "sagc.delta=0.1",  # a stated budget: G moves (none by default since issue 49)
    "sampling.max_new_tokens=32",
    "sampling.prompt_buckets=[16]", "sampling.decode_chunk=8", "init.sft_steps=8",
    "init.sft_batch_size=8", "optim.lr=1e-3", "optim.warmup_steps=0", "checkpoint.every=1",
    "checkpoint.keep=10", "run.progress=false", "run.plots=false",
]
ROOT = Path(__file__).resolve().parent.parent


def _cli(run_dir: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "sagc_jax.cli", "train", *TINY, f"run.dir={run_dir}", *extra]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["XLA_FLAGS"] = xla_flags(1)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _final_params(run_dir: Path) -> dict:
    mngr = ocp.CheckpointManager(run_dir / "checkpoints")
    step = mngr.latest_step()
    got = mngr.restore(step, args=ocp.args.Composite(params=ocp.args.StandardRestore()))
    return step, got["params"]


def _strip(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in rows]


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("ref") / "run"
    r = subprocess.run(_cli(run_dir, "run.steps=8"), env=_env(), capture_output=True, text=True,
                       timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    return run_dir


def test_run_dir_contents_and_zero_compiles(reference_run):
    d = reference_run
    for name in ("config.yaml", "metrics.jsonl", "trace.jsonl", "checkpoints", "tensorboard"):
        assert (d / name).exists(), name
    rows = read_jsonl(d / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, 9))
    required = {"step", "group_size", "prompts", "rows", "reward_mean", "len_mean", "len_max",
                "load_1m",
                "truncated_frac", "straggler_rate", "sagc_queue", "padding_waste", "rollout_s",
                "train_s", "step_s", "compiles", "loss", "kl", "grad_norm", "risk_g2", "risk_g4"}
    assert required <= set(rows[0])
    assert all(r["compiles"] == 0 for r in rows), [r["compiles"] for r in rows]
    assert all(r["rows"] == r["prompts"] * r["group_size"] for r in rows)
    trace = read_jsonl(d / "trace.jsonl")
    assert len(trace) == 8 and len(trace[0]["groups"][0]["lengths"]) == trace[0]["group_size"]
    assert load_config(d / "config.yaml").run.steps == 8
    # The controller's constants as the run ran them (what its replay reads, test_real_runs).
    assert sc.load_constants(d / sc.CONSTANTS_FILE) == sc.CONSTANTS


def test_kill_and_resume_is_exact(reference_run, tmp_path):
    """SIGKILL mid-run, re-run the same command: params bitwise equal, metrics equal."""
    run_dir = tmp_path / "run"
    cmd = _cli(run_dir, "run.steps=8")
    proc = subprocess.Popen(cmd, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            cwd=ROOT, start_new_session=True)
    metrics = run_dir / "metrics.jsonl"
    deadline = time.time() + 400
    while time.time() < deadline and proc.poll() is None:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 4:
            break
        time.sleep(0.05)
    assert proc.poll() is None, "run finished before it could be killed"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    killed_at = len(metrics.read_text().splitlines())
    assert killed_at < 8
    r = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "resumed from step" in r.stdout
    step_a, params_a = _final_params(reference_run)
    step_b, params_b = _final_params(run_dir)
    assert step_a == step_b == 8
    flat_a, flat_b = ocp.tree.to_flat_dict(params_a), ocp.tree.to_flat_dict(params_b)
    assert flat_a.keys() == flat_b.keys()
    for k in flat_a:
        np.testing.assert_array_equal(flat_a[k], flat_b[k], err_msg=str(k))
    ref_rows = _strip(read_jsonl(reference_run / "metrics.jsonl"))
    assert _strip(read_jsonl(metrics)) == ref_rows
    assert len({r["group_size"] for r in ref_rows}) > 1, "SAGC should move G in this run"


def test_corrupt_newest_checkpoint_falls_back(reference_run, tmp_path, capsys):
    import shutil

    run_dir = tmp_path / "run"
    shutil.copytree(reference_run, run_dir)
    newest = run_dir / "checkpoints" / "8" / "params"
    for f in newest.rglob("*"):
        if f.is_file() and f.stat().st_size > 0:
            f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])  # truncate every file
    code = main(["train", *TINY, f"run.dir={run_dir}", "run.steps=9"])
    out = capsys.readouterr().out
    assert code == 0
    assert "checkpoint step 8" in out and "falling back" in out
    assert "moved damaged checkpoint step 8 aside" in out
    assert "resumed from step 7" in out
    rows = read_jsonl(run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, 10))
    # The damaged step was moved aside, so steps 8 and 9 were saved again: the run is whole.
    ckpts = run_dir / "checkpoints"
    assert [p.name.split(".")[0] for p in ckpts.iterdir() if ".corrupt-" in p.name] == ["8"]
    assert {8, 9} <= set(ocp.CheckpointManager(ckpts).all_steps())
    from sagc_jax.open_run import load_policy

    load_policy(run_dir)
    assert "corrupt" not in capsys.readouterr().out


def test_incompatible_checkpoint_is_a_clear_error(reference_run, tmp_path, capsys):
    import shutil

    run_dir = tmp_path / "run"
    shutil.copytree(reference_run, run_dir)
    before = (run_dir / "config.yaml").read_text()
    code = main(["train", *TINY, f"run.dir={run_dir}", "run.steps=9", "model.hidden_size=48"])
    err = capsys.readouterr().err
    assert code == 2
    assert "hidden_size: checkpoint 32 vs config 48" in err
    # The failed resume left the run's own config alone: it can still be evaluated and rerun.
    assert (run_dir / "config.yaml").read_text() == before


def test_finished_run_says_so_before_compiling(reference_run, tmp_path, capsys):
    import shutil

    run_dir = tmp_path / "run"
    shutil.copytree(reference_run, run_dir)
    assert main(["train", *TINY, f"run.dir={run_dir}", "run.steps=8"]) == 0
    out = capsys.readouterr().out
    assert "already finished" in out and "run.steps" in out and "compiled" not in out


def test_unwritable_run_dir_fails_before_training(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    code = main(["train", *TINY, f"run.dir={blocker}/run", "run.steps=2"])
    err = capsys.readouterr().err
    assert code == 1
    assert str(blocker) in err


def test_config_errors_exit_2(capsys):
    assert main(["train", "sagc.detla=0.1"]) == 2
    assert "did you mean 'sagc.delta'" in capsys.readouterr().err
    assert main(["train", "sagc.delta=1.5"]) == 2
    assert "sagc.delta" in capsys.readouterr().err
    assert main(["train", "--config", "no/such/file.yaml"]) == 2
    assert "no/such/file.yaml" in capsys.readouterr().err


def test_raising_reward_saves_state_and_names_the_function(tmp_path, capsys):
    mod = tmp_path / "bad_reward_mod.py"
    mod.write_text("def boom(prompts, completions, **kw):\n"
                   "    raise RuntimeError('reward server down')\n")
    sys.path.insert(0, str(tmp_path))
    try:
        code = main(["train", *TINY, f"run.dir={tmp_path / 'run'}", "run.steps=2",
                     "rewards=[{name: 'bad_reward_mod:boom', weight: 1.0}]"])
    finally:
        sys.path.remove(str(tmp_path))
    err = capsys.readouterr().err
    assert code == 1
    assert "bad_reward_mod:boom" in err and "example 0" in err
    assert "state before step 1 saved" in err
    assert (tmp_path / "run" / "checkpoints" / "0").exists()


def test_malformed_dataset_row_names_file_and_line(tmp_path, capsys):
    data = tmp_path / "train.jsonl"
    data.write_text(json.dumps({"prompt": "1+1=", "answer": "2"}) + "\n{not json\n")
    code = main(["train", *TINY, f"run.dir={tmp_path / 'run'}", "run.steps=1", "data.task=null",
                 f"data.train_file={data}", "init.sft_steps=0"])
    err = capsys.readouterr().err
    assert code == 2
    assert "train.jsonl" in err and "line 2" in err


def test_too_long_prompt_and_bad_reward_are_refused_before_step_1(tmp_path, capsys):
    data = tmp_path / "train.jsonl"
    # A `solution` column too: the warm start's column check (data/columns.py) passes, so the
    # refusal is the long prompt's.
    data.write_text("".join(json.dumps({"prompt": p, "answer": "2", "solution": "#### 2"}) + "\n"
                            for p in ("1+1=", "1+" * 20 + "1=", "2+2=")))
    code = main(["train", *TINY, f"run.dir={tmp_path / 'run'}", "run.steps=1", "data.task=null",
                 f"data.train_file={data}"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert "example 1" in err and "sampling.prompt_buckets" in err
    assert "sampling.prompt_too_long" in err
    assert not (tmp_path / "run" / "checkpoints" / "initial").exists()  # before the SFT
    for name in ("no_such_reward", "no_such_module_xyz:f"):
        code = main(["train", *TINY, f"run.dir={tmp_path / 'run2'}", "run.steps=1",
                     f"rewards=[{{name: '{name}', weight: 1.0}}]"])
        err = capsys.readouterr().err.strip()
        assert code == 2 and len(err.splitlines()) == 1 and name in err


def test_full_disk_is_detected_before_training(tmp_path):
    from sagc_jax.checkpoint import RunCheckpointer

    ck = RunCheckpointer(tmp_path / "ck", every=1, keep=1)
    with pytest.raises(OSError, match=r"run.dir: .* free, this run needs about 909495 TiB"):
        ck.check_writable(min_free_bytes=10**18)


def test_sigint_stops_after_the_current_step_and_saves(tmp_path):
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(_cli(run_dir, "run.steps=50", "checkpoint.every=0"), env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                            start_new_session=True)
    metrics = run_dir / "metrics.jsonl"
    try:
        deadline = time.time() + 400
        while time.time() < deadline and proc.poll() is None:
            if metrics.exists() and len(metrics.read_text().splitlines()) >= 2:
                break
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err[-2000:]  # not 0: a script can tell it from a finished run
    assert "done:" not in out
    assert "stopped by signal" in err and len(err.strip().splitlines()) == 1
    done = len(metrics.read_text().splitlines())
    assert 2 <= done < 50
    step, _ = _final_params(run_dir)
    assert step == done


def test_sigterm_during_compile_keeps_the_sft_work(tmp_path):
    """SIGTERM after the SFT warm start (while compiling): exit 143 with one line; the rerun
    starts from the saved `checkpoints/initial` instead of redoing the SFT."""
    run_dir = tmp_path / "run"
    cmd = _cli(run_dir, "run.steps=1")
    proc = subprocess.Popen(cmd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=ROOT, start_new_session=True)
    try:
        for line in proc.stdout:  # "fresh start; SFT loss ..." once initial/ is saved
            if "fresh start" in line:
                break
        assert "fresh start; SFT loss" in line, line
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 143, err[-2000:]
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err[-2000:]
    assert not (run_dir / "metrics.jsonl").exists() or not read_jsonl(run_dir / "metrics.jsonl")
    r = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "SFT not redone" in r.stdout and "SFT loss" not in r.stdout
    assert [row["step"] for row in read_jsonl(run_dir / "metrics.jsonl")] == [1]


def test_simulate_replays_a_real_trace(reference_run, tmp_path):
    """The trainer's trace.jsonl is a valid `sagc-jax simulate` workload."""
    cfg = tmp_path / "sim.yaml"
    cfg.write_text(f"steps: 30\nseed: 0\nworkload:\n  trace: {reference_run / 'trace.jsonl'}\n"
                   "sagc: {group_sizes: [2, 4], initial_group_size: 4, delta: 0.1}\n")
    out = tmp_path / "sim.json"
    assert main(["simulate", "--config", str(cfg), "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert {"static-2", "static-4", "sagc"} <= set(res["policies"])
    assert 2 <= res["policies"]["sagc"]["mean_group_size"] <= 4


def test_new_algo_options_train(tmp_path):
    """`train ... algo.importance_sampling=sequence` with every other new algo key, micro-batches,
    μ = 2 and a reward that scores every other completion None, on the tiny model: it trains,
    and writes the new metric columns."""
    mod = tmp_path / "half_none_reward.py"
    mod.write_text("def half_none(prompts, completions, **kw):\n"
                   "    return [None if i % 2 else float(len(c) % 3 == 0)\n"
                   "            for i, c in enumerate(completions)]\n")
    run_dir = tmp_path / "run"
    sys.path.insert(0, str(tmp_path))
    try:
        code = main(["train", *TINY, f"run.dir={run_dir}", "run.steps=2", "init.sft_steps=0",
                     "sagc.group_sizes=[4]", "checkpoint.every=0",
                     "rewards=[{name: 'half_none_reward:half_none', weight: 1.0}]",
                     "algo.importance_sampling=sequence", "algo.epsilon=3e-4",
                     "algo.epsilon_high=4e-4", "algo.clip_delta=1.5", "algo.scale_rewards=batch",
                     "algo.std_ddof=1", "algo.beta=0.01", "algo.kl_bias_correction=true",
                     "algo.top_entropy_quantile=0.2", "algo.micro_batch_rows=8",
                     "algo.off_policy_mask_threshold=0.0", "algo.num_iterations=2"])
    finally:
        sys.path.remove(str(tmp_path))
    assert code == 0
    rows = read_jsonl(run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert np.isfinite(r["loss"]) and np.isfinite(r["grad_norm"])
        assert 0 < r["entropy"] < np.inf  # nats
        assert 0 <= r["frac_reward_zero_std"] <= 1 and 0 <= r["clip_ratio"] <= 1
        assert 0 <= r["off_policy_masked"] <= 1
