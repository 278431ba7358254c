"""The columns a run reads (SFT warm start, rewards) are checked at start-up: a file lacking one
stops `sagc-jax train` with exit 2 and one line naming the file, the row, the column and the
ways out (sagc_jax/data/columns.py), before any model is built."""

from __future__ import annotations

import json
import pathlib
import sys
import textwrap

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sagc_jax.cli import main
from sagc_jax.config import load_config
from sagc_jax.data.columns import required_columns, reward_columns
from sagc_jax.data.pipeline import load_examples, make_sft_batches
from sagc_jax.data.readers import DataError
from sagc_jax.data.tokenizer import load_tokenizer
from sagc_jax.rewards import build_reward_fns

ROOT = pathlib.Path(__file__).resolve().parents[1]
TINY = str(ROOT / "configs" / "tiny_cpu.yaml")
ROWS = [{"prompt": f"{i}+{i + 1}=", "answer": str(2 * i + 1)} for i in range(40)]


def _write_json(path: pathlib.Path, rows: list[dict]) -> str:
    path.write_text(json.dumps(rows), encoding="utf-8")
    return str(path)


def _write_jsonl(path: pathlib.Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


def _train(capsys, tmp_path: pathlib.Path, *overrides: str) -> tuple[int, str]:
    """`sagc-jax train` on tiny_cpu.yaml (its SFT warm start kept): exit code, stderr's last
    line (the error)."""
    capsys.readouterr()
    rc = main(["train", "--config", TINY, f"run.dir={tmp_path / 'run'}", "run.progress=false",
               *overrides])
    err = capsys.readouterr().err.strip().splitlines()
    return rc, err[-1] if err else ""


def test_own_json_without_solution_keeps_sft_exit_2_naming_file_column_and_ways_out(
        capsys, tmp_path):
    """The issue's case: the README's own-data recipe on a config with init.sft_steps."""
    train = _write_json(tmp_path / "train.json", ROWS)
    rc, line = _train(capsys, tmp_path, "data.task=null", f"data.train_file={train}",
                      f"data.eval_file={_write_jsonl(tmp_path / 'eval.jsonl', ROWS[:4])}")
    assert rc == 2
    assert line.startswith(f"sagc-jax train: error: {train} item 0: column 'solution' is "
                           "missing"), line
    for way_out in ("init.sft_steps=600", "set data.solution_column", "init.sft_steps=0"):
        assert way_out in line, line
    assert not (tmp_path / "run" / "checkpoints").exists()  # refused before anything was built


def test_jsonl_row_without_solution_is_named_by_line(tmp_path):
    rows = [dict(r, solution=f"#### {r['answer']}") for r in ROWS[:5]]
    del rows[2]["solution"]
    path = _write_jsonl(tmp_path / "t.jsonl", rows)
    cfg = load_config(TINY, ["data.task=null", f"data.train_file={path}"])
    need = required_columns(cfg, build_reward_fns(cfg.rewards), "train")
    with pytest.raises(DataError, match=rf"^{path} line 3: column 'solution' is missing"):
        load_examples(cfg.data, "train", required=need)
    rows[2]["solution"] = None
    _write_jsonl(tmp_path / "t.jsonl", rows)
    with pytest.raises(DataError, match=rf"^{path} line 3: column 'solution' is null"):
        load_examples(cfg.data, "train", required=need)


def test_parquet_without_solution_names_the_file(tmp_path):
    path = str(tmp_path / "t.parquet")
    pq.write_table(pa.Table.from_pylist(ROWS), path)
    cfg = load_config(TINY, ["data.task=null", f"data.train_file={path}"])
    with pytest.raises(DataError, match=rf"^{path}: column 'solution' is missing, and the SFT"):
        load_examples(cfg.data, "train",
                      required=required_columns(cfg, build_reward_fns(cfg.rewards), "train"))


def test_solution_column_option_feeds_the_warm_start(tmp_path):
    """The first way out: `data.solution_column` maps the file's column onto the warm start's
    target (and keeps it out of the reward columns)."""
    rows = [dict(r, completion=f"{r['prompt']}{r['answer']}\n#### {r['answer']}")
            for r in ROWS[:8]]
    path = _write_jsonl(tmp_path / "t.jsonl", rows)
    cfg = load_config(TINY, ["data.task=null", f"data.train_file={path}",
                             "data.solution_column=completion"])
    need = required_columns(cfg, build_reward_fns(cfg.rewards), "train")
    assert list(need) == ["completion"]
    examples = load_examples(cfg.data, "train", required=need)
    assert examples[3]["solution"] == rows[3]["completion"] and "completion" not in examples[3]
    tok = load_tokenizer(None)
    batch = next(make_sft_batches(examples, tokenizer=tok, batch_size=4))
    assert int(batch["loss_mask"].sum()) > 0


def test_sft_steps_0_needs_no_solution(tmp_path):
    path = _write_json(tmp_path / "train.json", ROWS)
    cfg = load_config(TINY, ["data.task=null", f"data.train_file={path}", "init.sft_steps=0"])
    need = required_columns(cfg, build_reward_fns(cfg.rewards), "train")
    assert need == {}
    assert len(load_examples(cfg.data, "train", required=need)) == len(ROWS)


def test_reasoning_gym_reward_on_own_file_exit_2(capsys, tmp_path):
    train = _write_json(tmp_path / "train.json", ROWS)
    rc, line = _train(capsys, tmp_path, "data.task=null", f"data.train_file={train}",
                      "init.sft_steps=0", "run.eval_every=0", "rewards=[{name: reasoning_gym}]")
    assert rc == 2
    assert f"{train} item 0: column 'rg_entry' is missing" in line, line
    assert "data.task=reasoning_gym" in line and "remove 'reasoning_gym' from rewards" in line


def test_reward_column_missing_from_a_built_in_task_exit_2(capsys, tmp_path):
    rc, line = _train(capsys, tmp_path, "rewards=[{name: reasoning_gym_strict}]")
    assert rc == 2
    assert "data.task arith (train split): column 'rg_entry' is missing" in line, line


def test_user_reward_columns_from_its_signature(tmp_path, monkeypatch, capsys):
    """A user's reward needs its keyword parameters without a default; the eval file is
    checked too (held-out evals score with the same functions)."""
    (tmp_path / "my_rewards.py").write_text(textwrap.dedent("""
        def unit_reward(prompts, completions, unit, answer=None, scale=1.0, **kw):
            return [float(u == "m") for u in unit]

        def loose_reward(prompts, completions, *, hint=None, **kw):
            return [0.0] * len(completions)
        """), encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "my_rewards", raising=False)
    import my_rewards

    assert reward_columns("my_rewards:unit_reward", my_rewards.unit_reward) == ("unit",)
    assert reward_columns("my_rewards:loose_reward", my_rewards.loose_reward) == ()
    assert reward_columns("exact_answer", None) == ("answer",)

    train = _write_json(tmp_path / "train.json", [dict(r, unit="m") for r in ROWS])
    evalf = _write_jsonl(tmp_path / "eval.jsonl", ROWS[:4])
    rc, line = _train(capsys, tmp_path, "data.task=null", f"data.train_file={train}",
                      f"data.eval_file={evalf}", "init.sft_steps=0",
                      "rewards=[{name: 'my_rewards:unit_reward'}]")
    assert rc == 2
    assert line.startswith(f"sagc-jax train: error: {evalf} line 1: column 'unit' is missing, "
                           "and reward 'my_rewards:unit_reward' reads it"), line


def test_eval_command_check_names_source_example_and_column():
    """`sagc-jax eval` checks its loaded examples against its rewards the same way."""
    from sagc_jax.data.columns import check_examples

    fns = build_reward_fns(["exact_answer", "reasoning_gym"])
    need = required_columns(None, fns, "eval")
    assert list(need) == ["rg_entry", "rg_config"]
    rows = [dict(r, rg_entry={}, rg_config="{}") for r in ROWS[:3]]
    check_examples(rows, need, "e.jsonl")  # every column there: no error
    del rows[2]["rg_config"]
    with pytest.raises(DataError, match=r"^e\.jsonl example 2: column 'rg_config' is missing, "
                                        r"and reward 'reasoning_gym' reads it"):
        check_examples(rows, need, "e.jsonl")
