"""Reliability (issue 34): the short versions of the fuzz and chaos harnesses of
`tools/reliability/` (configs, datasets, checkpoints, misbehaving rewards, no network) and
regression tests of the error paths they found. The long versions: `python -m
tools.reliability` (docs/results/reliability.md)."""

from __future__ import annotations

import errno
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from sagc_jax import checkpoint as ckpt
from sagc_jax.cli import main
from sagc_jax.config import ConfigError, load_config
from sagc_jax.data.readers import DataError, read_examples
from sagc_jax.models.config import ModelConfigError
from sagc_jax.models.hf_config import from_hf_dict
from sagc_jax.rewards import (
    RewardError,
    RewardFn,
    compute_rewards,
)
from tools.reliability import (
    fuzz_ckpt,
    fuzz_config,
    fuzz_data,
    fuzz_models,
    fuzz_resume,
    fuzz_tasks,
)

ROOT = Path(__file__).resolve().parent.parent

# ------------------------------------------------------------------------------ configs


def test_config_fuzz_every_case_is_a_config_or_one_line_error():
    res = fuzz_config.run_config_fuzz(600, seed=11)
    assert res.failures == [], res.failures[:3]
    assert res.tried == 600
    kinds = {k.split(":")[1] for k in res.outcomes}
    assert {"ok", "error"} <= kinds, res.outcomes  # both paths exercised


def test_config_errors_from_the_fuzzer_exit_2_in_one_line(tmp_path):
    """The in-process outcome "error" is exit 2 with one line from the real command."""
    dup = tmp_path / "dup.yaml"
    dup.write_text("sagc:\n  delta: 0.1\nrun:\n  steps: 3\nsagc:\n  delta: 0.2\n")
    cases = [["sagc.delta=" + "9" * 5000], ["optim.lr=1" + "0" * 400],
             ["--config", str(dup)]]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    for args in cases:
        r = subprocess.run([sys.executable, "-m", "sagc_jax.cli", "train", *args], env=env,
                           capture_output=True, text=True, timeout=120, cwd=ROOT)
        assert r.returncode == 2, (args[:1], r.stderr[-500:])
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr[-500:]
        assert "Traceback" not in r.stderr
    assert "duplicate key 'sagc' on lines 1 and 5" in r.stderr


def test_duplicate_keys_name_the_key_and_both_lines_at_any_depth(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("run:\n  steps: 3\n  seed: 1\n  steps: 4\n")
    with pytest.raises(ConfigError, match=r"c.yaml: duplicate key 'steps' on lines 2 and 4"):
        load_config(f)
    f.write_text("base: &b {delta: 0.1}\nsagc:\n  <<: *b\n  delta: 0.2\n")  # merge: allowed
    with pytest.raises(ConfigError, match="unknown key 'base"):
        load_config(f)
    with pytest.raises(ConfigError, match="duplicate key 'delta'"):
        load_config(None, ["sagc={delta: 0.1, delta: 0.2}"])


def test_non_utf8_config_and_huge_numbers_are_config_errors(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_bytes(b"run:\n  dir: \xff\xfe\n")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_config(f)
    with pytest.raises(ConfigError, match=r"sagc.delta: cannot parse value .*5000 chars"):
        load_config(None, ["sagc.delta=" + "9" * 5000])
    with pytest.raises(ConfigError, match=r"optim.lr: expected float"):  # no OverflowError
        load_config(None, ["optim.lr=1" + "0" * 400])


# ------------------------------------------------------------------------------ data


def test_data_fuzz_every_case_loads_or_names_file_and_row():
    res = fuzz_data.run_data_fuzz(400, seed=5)
    assert res.failures == [], res.failures[:3]
    assert any(k.endswith(":error") for k in res.outcomes)
    assert any(k.endswith(":loaded") for k in res.outcomes)


def test_json_array_dataset_loads_and_bad_items_are_named(tmp_path):
    f = tmp_path / "d.json"
    f.write_text(json.dumps([{"prompt": "1+1=", "answer": 2}, {"prompt": "2+2=", "answer": "4"}],
                            indent=1))
    assert read_examples(f) == [{"prompt": "1+1=", "answer": "2"},
                                {"prompt": "2+2=", "answer": "4"}]
    f.write_text(json.dumps([{"prompt": "1+1=", "answer": 2}, {"answer": "4"}]))
    with pytest.raises(DataError, match=r"d.json item 1: missing prompt column"):
        read_examples(f)
    f.write_text("[]")
    with pytest.raises(DataError, match="dataset is empty"):
        read_examples(f)
    f.write_text('{"prompt": "1+1=", "answer": 2}\n')  # a .json of JSON lines still works
    assert len(read_examples(f)) == 1


def test_rows_that_used_to_crash_are_data_errors(tmp_path):
    f = tmp_path / "d.jsonl"
    for line, match in ((b'{"prompt": "\\ud800", "answer": 1}', r"line 1: prompt .*surrogate"),
                        (b'{"prompt": ' + b"[" * 20000 + b"]" * 20000 + b"}",
                         r"line 1: bad JSON: nested too deeply"),
                        (b'{"prompt": "a", "answer": ' + b"9" * 5000 + b"}",
                         r"line 1: bad JSON: Exceeds the limit")):
        f.write_bytes(line + b"\n")
        with pytest.raises(DataError, match=match):
            read_examples(f)


# ------------------------------------------------------------------------------ model config


def test_damaged_and_foreign_model_files_are_refused_naming_file_and_tensor():
    """The short model-file harness: every kind of damage (truncated / foreign-architecture /
    missing-tensor GGUF; truncated, missing- and extra-tensor safetensors; a tokenizer larger
    than the vocabulary) is refused with one line naming the file (and the tensor,
    architecture or vocabulary size); two kinds also through the CLI (exit 2). Before issue 50
    a safetensors file missing a tensor exited 1, and a foreign architecture or a truncated
    GGUF was reported as a tokenizer problem."""
    res = fuzz_models.run_model_fuzz(2, seed=50, cli=False)
    assert res.failures == [], res.failures[:3]
    assert res.tried == 2 * len(fuzz_models.KINDS)
    assert all(r["exit"] == 2 for r in res.records if r["outcome"] == "refused")
    res = fuzz_models.run_model_fuzz(1, seed=51, kinds=("gguf_architecture",
                                                        "st_missing_tensor"))
    assert res.failures == [], res.failures
    assert [r["cli_exit"] for r in res.records] == [2, 2]


def test_impossible_task_options_are_refused_naming_the_key(tmp_path):
    """The short task-option harness: every kind (unknown or misconfigured reasoning-gym
    datasets, weights, system prompts, empty dataset maps, prompts longer than every bucket,
    built-in task options) refused in one line naming a data. / sampling. key, exit 2. Before
    it, an infinite weight and an unknown task name exited 1."""
    res = fuzz_tasks.run_task_fuzz(2, seed=7, work=tmp_path)
    assert res.failures == [], res.failures[:3]
    assert res.tried == 2 * len(fuzz_tasks.KINDS)
    assert {r["exit_code"] for r in res.records} == {2}
    out = fuzz_tasks.check_one(["data.task=arith9"], tmp_path / "x")
    assert out[0] == "refused, one line naming the key" and out[2].startswith("data.task:")
    out = fuzz_tasks.check_one(["data.task=reasoning_gym", "init.sft_steps=0",
                                "data.task_options={datasets: {chain_sum: {weight: .inf}}}"],
                               tmp_path / "y")
    assert "chain_sum.weight: must be a finite number > 0" in out[2]


def test_resume_with_a_changed_config_is_refused_or_resumed(tmp_path):
    """The short resume harness: LoRA switched on and other rungs of the same count are refused
    in one line naming the key, the run dir untouched (before issue 50's harness: exit 1, the
    checkpoint reported as unreadable; the same-count rungs resumed silently); a new learning
    rate resumes to the next step."""
    cases = (("model.lora={rank: 4, alpha: 8.0}", True), ("sagc.group_sizes=[4,8]", True),
             ("optim.lr=3e-4", False))
    res = fuzz_resume.run_resume_fuzz(tmp_path, cases)
    assert res.failures == [], res.failures
    assert [r["exit_code"] for r in res.records] == [2, 2, 0]
    assert res.records[1]["line"].startswith("sagc-jax train: error: sagc.group_sizes: ")


def test_model_config_field_types_are_checked_by_name():
    base = {"model_type": "llama", "vocab_size": 101, "hidden_size": 32,
            "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4}
    assert from_hf_dict(base).hidden_size == 32
    for k, v, want in (("hidden_size", None, "an integer"), ("num_hidden_layers", "2", "an int"),
                       ("vocab_size", True, "an integer"), ("rms_norm_eps", "x", "a number"),
                       ("tie_word_embeddings", 1, "true or false"),
                       ("eos_token_id", [1, "a"], "an integer, a list of integers")):
        with pytest.raises(ModelConfigError, match=f"config field '{k}': expected {want}"):
            from_hf_dict({**base, k: v})
    with pytest.raises(ModelConfigError, match="expected a JSON object"):
        from_hf_dict([1, 2])


def test_bad_model_config_json_makes_train_exit_2(tmp_path, capsys):
    model = tmp_path / "model"
    model.mkdir()
    cfg = {"model_type": "llama", "vocab_size": 101, "hidden_size": None,
           "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4}
    (model / "config.json").write_text(json.dumps(cfg))
    args = ["train", f"model.path={model}", "data.task=arith_short", "run.steps=1",
            f"run.dir={tmp_path / 'run'}", "run.progress=false"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "'hidden_size'" in err and "config.json" in err, err
    cfg.update(hidden_size=32, num_key_value_heads=3)  # __post_init__: 3 kv heads for 4
    (model / "config.json").write_text(json.dumps(cfg))
    assert main(args) == 2
    assert "model config field" in capsys.readouterr().err


# ------------------------------------------------------------------------------ checkpoints


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> fuzz_ckpt.Saved:
    return fuzz_ckpt.make_saved(tmp_path_factory.mktemp("rel"))


def test_checkpoint_fuzz_falls_back_or_errors_never_wrong(saved):
    res = fuzz_ckpt.run_ckpt_fuzz(8, seed=3, saved=saved)
    assert res.failures == [], res.failures
    assert res.tried == 8


@pytest.mark.parametrize("exc", [OSError(errno.EIO, "Input/output error"),
                                 OSError(errno.ENOSPC, "No space left on device"),
                                 InterruptedError(errno.EINTR, "Interrupted system call"),
                                 MemoryError("out of memory"), KeyboardInterrupt(),
                                 ValueError("RESOURCE_EXHAUSTED: Error reading ... "
                                            "[os_error_code=12]")],
                         ids=lambda e: type(e).__name__ + str(getattr(e, "errno", "") or ""))
def test_transient_restore_errors_are_raised_with_nothing_moved(saved, tmp_path, monkeypatch,
                                                                exc):
    import shutil

    import orbax.checkpoint as ocp

    d = tmp_path / "checkpoints"
    shutil.copytree(saved.dir, d)
    real = ocp.CheckpointManager.restore

    def flaky(self, step, *a, **kw):  # the newest step's items fail to read, transiently
        args = kw.get("args")
        if step == 2 and args is not None and "params" in tuple(args.keys()):
            raise exc
        return real(self, step, *a, **kw)

    monkeypatch.setattr(ocp.CheckpointManager, "restore", flaky)
    ck = ckpt.RunCheckpointer(d, every=1, keep=5, async_save=False)
    with pytest.raises(type(exc)):
        ck.restore_latest(saved.template(), saved.mcfg)
    ck.close()
    assert sorted(p.name for p in d.iterdir() if p.name[0].isdigit()) == ["1", "2"]


def _raised(e: BaseException) -> BaseException:
    try:
        raise e
    except BaseException as caught:  # with a traceback whose frames are this file's
        return caught


def test_integrity_failures_are_told_from_transient_ones():
    def chained(outer: Exception, inner: BaseException) -> Exception:
        outer.__cause__ = inner
        return outer

    damaged = [ckpt.CheckpointCorruptError("checksum mismatch"), FileNotFoundError("x"),
               ValueError("DATA_LOSS: Error reading"), json.JSONDecodeError("x", "{", 0),
               chained(Exception("Encountered error while reading array index"),
                       ValueError("OUT_OF_RANGE: Requested byte range [1, 2)")),
               UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")]
    transient = [MemoryError(), OSError(errno.EIO, "EIO"), KeyboardInterrupt(),
                 ValueError("UNAVAILABLE: try again"),
                 ValueError("NOT_FOUND: Error reading local file [OS error 5: I/O error]"),
                 chained(Exception("Encountered error while reading array index"),
                         OSError(errno.ENOSPC, "full")), RuntimeError("something else"),
                 _raised(AttributeError("a bug of ours, not Orbax's"))]
    assert all(ckpt.integrity_failure(e) for e in damaged), damaged
    assert not any(ckpt.integrity_failure(e) for e in transient)


def test_undecodable_chunks_fall_back_without_library_tracebacks(saved, tmp_path, capfd):
    """Orbax drops its failed read coroutines unawaited; Python used to print each as
    "Exception ignored in: <coroutine ...>" with a traceback and a page of TensorStore spec."""
    import shutil

    d = tmp_path / "checkpoints"
    shutil.copytree(saved.dir, d)
    for f in (d / "2" / "params").rglob("*"):
        if f.is_file() and f.parent.name == "d" and f.stat().st_size > 256:
            f.write_bytes(f.read_bytes()[:20])
    ck = ckpt.RunCheckpointer(d, every=1, keep=5, async_save=False)
    assert ck.restore_latest(saved.template(), saved.mcfg).step == 1
    ck.close()
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Exception ignored" not in err, err[-2000:]


def test_metadata_of_the_wrong_shape_is_damage_not_a_crash(saved, tmp_path):
    """Found by the fuzzer: a flipped bit in a key of `array_metadatas/process_0` leaves valid
    JSON that Orbax fails on with AttributeError ('dict' object has no attribute
    'param_name'): that is damaged bytes (fall back), not an error of this run."""
    import shutil

    d = tmp_path / "checkpoints"
    shutil.copytree(saved.dir, d)
    f = d / "2" / "params" / "array_metadatas" / "process_0"
    f.write_text(f.read_text().replace('"array_metadata"', '"array_metadbta"', 1))
    ck = ckpt.RunCheckpointer(d, every=1, keep=5, async_save=False)
    assert ck.restore_latest(saved.template(), saved.mcfg).step == 1
    assert any(p.name.startswith("2.corrupt-") for p in d.iterdir())


def test_unreadable_model_json_is_one_line(saved, tmp_path):
    import shutil

    d = tmp_path / "checkpoints"
    shutil.copytree(saved.dir, d)
    (d / "model.json").write_bytes(b'{"vocab_size": 1\xff')
    ck = ckpt.RunCheckpointer(d, every=1, keep=5, async_save=False)
    with pytest.raises(ckpt.CheckpointCorruptError, match=r"model.json is unreadable"):
        ck.restore_latest(saved.template(), saved.mcfg)


# ------------------------------------------------------------------------------ rewards


def _sleeps(prompts, completions, **_):
    time.sleep(3600)


def _raises_1pct(prompts, completions, **_):
    out = []
    for c in completions:
        if c.endswith("37"):
            raise RuntimeError(f"verifier crashed on {c!r}")
        out.append(1.0)
    return out


def _nan(prompts, completions, **_):
    return [float("nan") if c.endswith("5") else 0.5 for c in completions]


def test_a_reward_that_never_returns_is_stopped_by_the_timeout(caplog):
    fns = [RewardFn("stuck", _sleeps, timeout_s=0.2)]
    with pytest.raises(RewardError, match=r"reward 'stuck' failed on example 0: did not return "
                                          r"within 0.2 s \(reward_timeout_s"):
        compute_rewards(fns, ["p"] * 4, ["a", "b", "c", "d"])
    with caplog.at_level(logging.WARNING, logger="sagc_jax"):
        res = compute_rewards(fns, ["p"] * 2, ["a", "b"], on_error="zero")
    assert res.total.tolist() == [0, 0] and res.num_errors == 2
    assert all("did not return" in m for m in res.messages)
    assert fns[0].timeout_s == 0.2 and RewardFn("x", _sleeps).timeout_s is None  # off by default


def test_a_reward_raising_on_1pct_and_one_returning_nan_have_the_documented_outcome():
    comps = [f"row{i}" for i in range(200)]  # row37, row137 raise: 1 %
    for fns in ([RewardFn("flaky", _raises_1pct)], [RewardFn("flaky", _raises_1pct, 1.0, 5.0)]):
        with pytest.raises(RewardError, match=r"'flaky' failed on example 37: raised RuntimeError"):
            compute_rewards(fns, [""] * 200, comps)
        res = compute_rewards(fns, [""] * 200, comps, on_error="zero")
        assert res.num_errors == 2 and res.total[37] == res.total[137] == 0
        assert res.total.sum() == 198
    with pytest.raises(RewardError, match=r"'nan' returned a bad value for example 5: non-finite"):
        compute_rewards([RewardFn("nan", _nan)], [""] * 20, [str(i) for i in range(20)])
    res = compute_rewards([RewardFn("nan", _nan)], [""] * 20, [str(i) for i in range(20)],
                          on_error="zero")
    assert np.isfinite(res.total).all() and res.num_errors == 2 and res.total[5] == 0


def test_reward_timeout_is_a_config_field_off_by_default():
    assert load_config(None).reward_timeout_s is None
    assert load_config(None, ["reward_timeout_s=2.5"]).reward_timeout_s == 2.5
    with pytest.raises(ConfigError, match="reward_timeout_s: must be > 0"):
        load_config(None, ["reward_timeout_s=0"])


# ------------------------------------------------------------------------------ network


_NO_NET = """
import json, socket, sys
attempts = []
def refuse(self, address, *a):
    if self.family in (socket.AF_INET, socket.AF_INET6):
        attempts.append(address)
        sys.stderr.write(f"NETWORK ACCESS {address}\\n")
        raise OSError("network access blocked by the test")
    return real(self, address, *a)
real = socket.socket.connect
socket.socket.connect = refuse
socket.socket.connect_ex = refuse
from sagc_jax.cli import main
for argv in json.loads(sys.argv[1]):
    print("EXIT", main(argv), flush=True)
sys.exit(99 if attempts else 0)
"""


def test_cli_reaches_for_no_network_and_names_a_missing_tokenizer(tmp_path):
    env = {k: v for k, v in os.environ.items()
           if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}  # main sets them itself
    env["PYTHONPATH"] = str(ROOT)
    base = ["train", "data.task=arith_short", "run.steps=1", "run.progress=false",
            f"run.dir={tmp_path / 'run'}"]
    missing = str(tmp_path / "no" / "such" / "tokenizer")
    argvs = [[*base, f"model.tokenizer={missing}"], [*base, "model.tokenizer=no-such-org-model"]]
    r = subprocess.run([sys.executable, "-c", _NO_NET, json.dumps(argvs)], env=env,
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert "NETWORK ACCESS" not in r.stderr and r.returncode == 0, r.stderr[-2000:]
    assert [ln for ln in r.stdout.splitlines() if ln.startswith("EXIT")] == ["EXIT 2"] * 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 2 and all("model.tokenizer" in ln for ln in lines), lines
    assert missing in lines[0] and "does not exist" in lines[0]
    assert "no-such-org-model" in lines[1] and "local Hugging Face cache" in lines[1]
    assert "Repo id" not in r.stderr


# ------------------------------------------------------------------------------ dry run


def test_dry_run_device_memory_check_catches_only_what_is_expected(monkeypatch, capsys):
    import jax

    from sagc_jax import dryrun

    class Dev:
        def __init__(self, stats=None, exc=None):
            self.stats, self.exc = stats, exc

        def memory_stats(self):
            if self.exc is not None:
                raise self.exc
            return self.stats

    def use(dev):
        monkeypatch.setattr(jax, "devices", lambda *a: [dev])

    use(Dev({"bytes_limit": 80 * 2**30}))
    assert dryrun._local_device_memory() == 80 * 2**30
    use(Dev(None))  # CPU
    assert dryrun._local_device_memory() is None
    use(Dev(exc=NotImplementedError()))
    assert dryrun._local_device_memory() is None
    assert capsys.readouterr().err == ""
    use(Dev(exc=jax.errors.JaxRuntimeError("INTERNAL: driver\nfailure")))
    assert dryrun._local_device_memory() is None
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot read device memory: INTERNAL: driver failure" in err
    use(Dev(exc=TypeError("a bug")))  # not expected: surfaces
    with pytest.raises(TypeError, match="a bug"):
        dryrun._local_device_memory()
