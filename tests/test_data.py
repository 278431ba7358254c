"""Tests for sagc_jax.data: tasks, tokenizer, readers, grain pipeline, SFT batches."""

from __future__ import annotations

import collections
import json
import os
import pathlib

import numpy as np
import pytest

from sagc_jax.data.pipeline import load_examples, make_prompt_iterator, make_sft_batches
from sagc_jax.data.readers import DataError, read_examples, read_jsonl, read_parquet
from sagc_jax.data.tasks import (
    ArithSource,
    check_arith_solution,
    get_task,
    make_arith_examples,
    prompt_split,
)
from sagc_jax.data.tokenizer import (
    decode_completion,
    encode_prompt,
    load_tokenizer,
    packaged_tokenizer_dir,
)


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(None)


@pytest.fixture(scope="module")
def train2k():
    return make_arith_examples(2000, seed=0)


# ----------------------------------------------------------------------------- tasks


def test_arith_deterministic(train2k):
    assert make_arith_examples(50, seed=0) == train2k[:50]
    assert make_arith_examples(50, seed=1) != train2k[:50]
    src = ArithSource(2000, 0)
    assert src[1234] == train2k[1234] and src[-1] == train2k[-1]
    assert src[3:6] == train2k[3:6]
    with pytest.raises(IndexError):
        src[2000]
    ex = train2k[0]
    assert set(ex) == {"prompt", "answer", "solution", "num_steps"}
    assert isinstance(ex["prompt"], str) and ex["prompt"].endswith("=")


def test_arith_solutions_correct(train2k):
    for ex in train2k:
        assert check_arith_solution(ex["prompt"], ex["solution"]), ex
        # Independent check: the prompt, evaluated left to right, equals the answer.
        assert eval(ex["prompt"][:-1]) == int(ex["answer"])  # +/- only: left-assoc == Python
        lines = ex["solution"].split("\n")
        assert len(lines) == ex["num_steps"] + 1 and lines[-1] == f"#### {ex['answer']}"
        for line in lines[:-1]:
            lhs, rhs = line.split("=")
            assert eval(lhs) == int(rhs) and 0 <= int(rhs) <= 99
        assert all(c in "0123456789" for c in ex["prompt"][:-1].replace("+", "").replace("-", ""))
    assert not check_arith_solution("1+2=", "1+2=4\n#### 4")


def test_arith_length_distribution(train2k):
    steps = np.array([e["num_steps"] for e in train2k])
    counts = collections.Counter(steps.tolist())
    assert steps.min() == 1 and steps.max() == 12
    assert counts[12] >= 3  # the tail reaches max_steps
    assert 2.5 < steps.mean() < 4.0  # most prompts short
    assert np.median(steps) <= 3
    assert counts[1] > counts[2] > counts[4] > counts[8]
    lens = np.array([len(e["solution"]) for e in train2k])
    assert lens.max() > 4 * np.median(lens)  # long tail in completion length
    custom = make_arith_examples(300, seed=0, min_steps=3, max_steps=5)
    assert {e["num_steps"] for e in custom} == {3, 4, 5}


def test_train_eval_disjoint(train2k):
    task = get_task("arith")
    assert task.default_reward == "exact_answer"
    ev = task.eval_examples(300)
    assert ev == task.eval_examples(300)
    assert all(prompt_split(e["prompt"]) == "eval" for e in ev)
    train = task.train_examples(seed=0, n=100_000)
    assert len(train) == 100_000
    assert train[:2000] == train2k
    assert not {e["prompt"] for e in ev} & {e["prompt"] for e in train2k}
    assert not {e["prompt"] for e in ev} & {e["prompt"] for e in task.train_examples(7, 2000)}
    with pytest.raises(ValueError, match="built-in tasks: arith"):
        get_task("nope")


# ----------------------------------------------------------------------------- tokenizer


def test_tokenizer_special_ids_and_autoload(tok):
    from transformers import AutoTokenizer

    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (0, 1, 2)
    auto = AutoTokenizer.from_pretrained(packaged_tokenizer_dir())
    assert auto.pad_token == "<pad>" and auto.eos_token == "<eos>" and len(auto) == len(tok)
    assert os.path.isfile(os.path.join(packaged_tokenizer_dir(), "tokenizer.json"))
    with pytest.raises(ValueError, match="cannot load tokenizer"):
        load_tokenizer("/nonexistent/tokenizer")


def test_tokenizer_roundtrip(tok, train2k):
    texts = [e["prompt"] for e in train2k[:200]] + [e["solution"] for e in train2k[:200]]
    texts.append("Hello, World!  ~`{}[]|\\^_\t\nWhat is 2*3? $4.50 #### -7")
    for text in texts:
        ids = encode_prompt(tok, text, chat_template=False)
        assert ids[0] == tok.bos_token_id
        assert tok.decode(ids[1:]) == text
        assert decode_completion(tok, [*ids[1:], tok.eos_token_id, 5, 6, 0, 0]) == text
    ids = encode_prompt(tok, "<bos>1+2=", chat_template=False)  # no double bos
    assert ids.count(tok.bos_token_id) == 1
    assert decode_completion(tok, np.array([29, 0, 0])) == "7"


def test_chat_template(tok):
    ids = encode_prompt(tok, "1+2=", chat_template=True)
    assert ids.count(tok.bos_token_id) == 1 and ids[0] == tok.bos_token_id
    assert tok.decode(ids[1:]) == "user: 1+2=\nassistant: "


# ----------------------------------------------------------------------------- readers


def test_read_jsonl(tmp_path):
    p = tmp_path / "d.jsonl"
    rows = [
        {"question": "1+1=", "final": 2, "source": "x"},
        {"question": "2+2=", "final": "4", "source": "y"},
    ]
    p.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    out = read_jsonl(p, prompt_column="question", answer_column="final")
    assert out == [
        {"prompt": "1+1=", "answer": "2", "source": "x"},
        {"prompt": "2+2=", "answer": "4", "source": "y"},
    ]
    assert read_examples(p, "question", "final") == out


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ('{"prompt": "a", "answer": ', "bad JSON"),
        ('{"answer": "1"}', "missing prompt column 'prompt'"),
        ('{"prompt": "a"}', "missing answer column 'answer'"),
        ('{"prompt": 3, "answer": "1"}', "must be a string, got int"),
        ("[1, 2]", "expected a JSON object"),
    ],
)
def test_read_jsonl_malformed(tmp_path, line, why):
    p = tmp_path / "bad.jsonl"
    p.write_text('{"prompt": "ok", "answer": "1"}\n\n' + line + "\n")
    with pytest.raises(DataError, match=why) as e:
        read_jsonl(p)
    assert f"{p} line 3" in str(e.value)


def test_read_empty_and_missing(tmp_path):
    p = tmp_path / "empty.jsonl"
    p.write_text("\n")
    with pytest.raises(DataError, match="empty") as e:
        read_jsonl(p)
    assert str(p) in str(e.value)
    with pytest.raises(DataError, match="cannot open"):
        read_jsonl(tmp_path / "nope.jsonl")


def test_read_parquet(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    p = tmp_path / "d.parquet"
    pq.write_table(pa.table({"prompt": ["a", "b"], "answer": ["1", "2"], "k": [1, 2]}), p)
    assert read_parquet(p) == [
        {"prompt": "a", "answer": "1", "k": 1},
        {"prompt": "b", "answer": "2", "k": 2},
    ]
    assert load_examples({"train_file": str(p)}, "train") == read_parquet(p)
    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"prompt": ["a", None], "answer": ["1", "2"]}), bad)
    with pytest.raises(DataError, match=r"bad\.parquet row 1: .*must be a string, got NoneType"):
        read_parquet(bad)
    with pytest.raises(DataError, match="missing answer column 'ans'"):
        read_parquet(p, answer_column="ans")
    empty = tmp_path / "empty.parquet"
    pq.write_table(
        pa.table({"prompt": pa.array([], pa.string()), "answer": pa.array([], pa.string())}), empty
    )
    with pytest.raises(DataError, match="empty") as e:
        read_parquet(empty)
    assert str(empty) in str(e.value)


# ----------------------------------------------------------------------------- pipeline


def _prompts(it, k):
    return [next(it)["prompt"] for _ in range(k)]


def test_prompt_iterator_shuffle_and_fields(tok):
    src = make_arith_examples(40, seed=3)
    it = make_prompt_iterator(src, tokenizer=tok, seed=0, num_epochs=1)
    first = next(it)
    assert set(first) == {"prompt", "answer", "solution", "num_steps", "prompt_ids"}
    assert first["prompt_ids"].dtype == np.int32
    assert first["prompt_ids"].tolist() == encode_prompt(tok, first["prompt"], False)
    a = [first["prompt"], *(x["prompt"] for x in it)]
    b = [x["prompt"] for x in make_prompt_iterator(src, tokenizer=tok, seed=0, num_epochs=1)]
    c = [x["prompt"] for x in make_prompt_iterator(src, tokenizer=tok, seed=1, num_epochs=1)]
    d = [x["prompt"] for x in make_prompt_iterator(src, tokenizer=tok, shuffle=False, num_epochs=1)]
    assert a == b and a != c and sorted(a) == sorted(c) == sorted(e["prompt"] for e in src)
    assert d == [e["prompt"] for e in src]


def test_prompt_iterator_epochs(tok):
    src = [{"prompt": f"{i}=", "answer": str(i)} for i in range(10)]
    out = [x["prompt"] for x in make_prompt_iterator(src, tokenizer=tok, seed=0, num_epochs=3)]
    assert len(out) == 30
    epochs = [out[i : i + 10] for i in range(0, 30, 10)]
    assert all(sorted(e) == sorted(x["prompt"] for x in src) for e in epochs)
    assert epochs[0] != epochs[1]  # reshuffled each epoch
    forever = make_prompt_iterator(src, tokenizer=tok, seed=0, num_epochs=None)
    assert _prompts(forever, 30) == out and len(_prompts(forever, 50)) == 50


def test_prompt_iterator_process_sharding(tok):
    src = [{"prompt": f"{i}=", "answer": str(i)} for i in range(23)]
    shards = [
        [
            x["prompt"]
            for x in make_prompt_iterator(
                src, tokenizer=tok, seed=5, num_epochs=1, process_index=p, process_count=3
            )
        ]
        for p in range(3)
    ]
    flat = [p for s in shards for p in s]
    assert len(flat) == len(set(flat)) == 23  # disjoint and covering
    with pytest.raises(ValueError, match="process_index"):
        make_prompt_iterator(src, tokenizer=tok, process_index=3, process_count=3)


def test_prompt_iterator_state_restore(tok, tmp_path):
    import grain
    import orbax.checkpoint as ocp

    src = get_task("arith").train_examples(seed=0, n=1000)
    it = make_prompt_iterator(src, tokenizer=tok, seed=9)
    _prompts(it, 17)
    state = it.get_state()
    json.dumps(state)  # JSON-able
    expected = _prompts(it, 25)
    it.set_state(state)
    assert _prompts(it, 25) == expected
    fresh = make_prompt_iterator(src, tokenizer=tok, seed=9)
    fresh.set_state(state)
    assert _prompts(fresh, 25) == expected

    # Orbax + grain's checkpoint handler.
    it.set_state(state)
    ckpt = ocp.Checkpointer(grain.checkpoint.CheckpointHandler())
    ckpt.save(tmp_path / "data_iter", args=grain.checkpoint.CheckpointSave(it))
    restored = make_prompt_iterator(src, tokenizer=tok, seed=9)
    ckpt.restore(tmp_path / "data_iter", args=grain.checkpoint.CheckpointRestore(restored))
    assert _prompts(restored, 25) == expected


def test_prompt_iterator_max_len(tok):
    src = [{"prompt": "1+2+3+4=", "answer": "10"}]
    it = make_prompt_iterator(src, tokenizer=tok, num_epochs=1, max_prompt_len=4)
    with pytest.raises(DataError, match="exceeds max_prompt_len=4"):
        next(it)
    it = make_prompt_iterator(
        src, tokenizer=tok, num_epochs=1, max_prompt_len=4, truncate_prompts=True
    )
    ids = next(it)["prompt_ids"].tolist()
    assert ids[0] == tok.bos_token_id and tok.decode(ids[1:]) == "+4="
    with pytest.raises(DataError, match="empty"):
        make_prompt_iterator([], tokenizer=tok)


def test_prompt_iterator_workers(tok):
    src = make_arith_examples(60, seed=2)
    a = [x["prompt"] for x in make_prompt_iterator(src, tokenizer=tok, seed=1, num_epochs=1)]
    it = make_prompt_iterator(src, tokenizer=tok, seed=1, num_epochs=1, worker_count=1)
    assert [x["prompt"] for x in it] == a


def test_sft_batches(tok):
    src = make_arith_examples(10, seed=4)
    batches = list(make_sft_batches(src, tokenizer=tok, batch_size=4, seed=0))
    assert len(batches) == 2  # remainder dropped
    again = list(make_sft_batches(src, tokenizer=tok, batch_size=4, seed=0))
    assert all((a["tokens"] == b["tokens"]).all() for a, b in zip(batches, again))
    by_prompt = {e["prompt"]: e for e in src}
    for b in batches:
        tokens, loss, inp = b["tokens"], b["loss_mask"], b["input_mask"]
        assert tokens.shape == loss.shape == inp.shape and tokens.shape[0] == 4
        assert tokens.dtype == np.int32 and tokens.shape[1] % 16 == 0
        for r in range(4):
            n = int(inp[r].sum())
            assert (tokens[r, n:] == tok.pad_token_id).all() and inp[r, :n].all()
            assert tokens[r, 0] == tok.bos_token_id and tokens[r, n - 1] == tok.eos_token_id
            start = int(np.argmax(loss[r]))
            assert loss[r, start:n].all() and not loss[r, :start].any() and not loss[r, n:].any()
            prompt = tok.decode(tokens[r, 1:start])
            assert tok.decode(tokens[r, start : n - 1]) == by_prompt[prompt]["solution"]
    padded = list(
        make_sft_batches(
            src, tokenizer=tok, batch_size=4, drop_remainder=False, seq_len=128, num_epochs=2
        )
    )
    assert len(padded) == 6 and all(b["tokens"].shape == (4, 128) for b in padded)
    assert padded[2]["input_mask"].sum(axis=1).tolist()[2:] == [0, 0]
    with pytest.raises(DataError, match="seq_len=8"):
        next(make_sft_batches(src, tokenizer=tok, batch_size=2, seq_len=8))
    with pytest.raises(DataError, match="'solution' column"):
        next(make_sft_batches([{"prompt": "a", "answer": "1"}], tokenizer=tok, batch_size=1))


def test_load_examples_task_and_file(tmp_path):
    cfg = {"task": "arith", "seed": 0, "num_train": 100, "num_eval": 20}
    assert len(load_examples(cfg, "train")) == 100 and len(load_examples(cfg, "eval")) == 20
    p = pathlib.Path(tmp_path) / "e.jsonl"
    p.write_text('{"q": "x", "a": "1"}\n')
    cfg2 = {"task": "arith", "eval_file": str(p), "prompt_column": "q", "answer_column": "a"}
    assert load_examples(cfg2, "eval") == [{"prompt": "x", "answer": "1"}]
    with pytest.raises(DataError, match="no eval data configured"):
        load_examples({}, "eval")


def test_load_examples_from_config():
    from sagc_jax import config as config_mod

    cfg = config_mod.Config()
    cfg_data = cfg.data.model_copy(
        update={"task_min_steps": 2, "task_max_steps": 4, "num_eval": 30}
    )
    cfg = cfg.model_copy(update={"data": cfg_data})
    ev = load_examples(cfg.data, "eval")
    assert len(ev) == 30 and {e["num_steps"] for e in ev} <= {2, 3, 4}
    train = load_examples(cfg, "train")
    assert train[:5] == make_arith_examples(5, seed=cfg.run.seed, min_steps=2, max_steps=4)
    assert load_examples(cfg.data, "train", seed=3)[:5] == make_arith_examples(
        5, seed=3, min_steps=2, max_steps=4
    )
