"""The GSM8K path end to end on a tiny local file in the openai/gsm8k format: JSONL and Parquet
rows {question, answer="... #### N"} -> examples -> chat-templated prompt ids -> the config's
rewards (gsm8k + format) on completions. No download: the packaged tokenizer's chat template
stands in for Qwen's."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from sagc_jax.config import load_config
from sagc_jax.data.pipeline import load_examples, make_prompt_iterator
from sagc_jax.data.tokenizer import load_tokenizer
from sagc_jax.rewards import RewardFn, compute_rewards

ROOT = Path(__file__).resolve().parent.parent
GPU = ROOT / "configs" / "qwen2.5-0.5b_gsm8k_gpu.yaml"

ROWS = [  # two rows as openai/gsm8k "main" stores them
    {"question": "Natalia sold clips to 48 of her friends in April, and then she sold half as "
                 "many clips in May. How many clips did Natalia sell altogether in April and May?",
     "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = "
               "<<48+24=72>>72 clips altogether in April and May.\n#### 72"},
    {"question": "Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of "
                 "babysitting. How much did she earn?",
     "answer": "Weng earns 12/60 = $<<12/60=0.2>>0.2 per minute.\nWorking 50 minutes, she "
               "earned 0.2 x 50 = $<<0.2*50=10>>10.\n#### 10"},
]


def _write(tmp_path: Path) -> tuple[Path, Path]:
    jsonl = tmp_path / "train.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in ROWS), encoding="utf-8")
    parquet = tmp_path / "test.parquet"
    pq.write_table(pa.Table.from_pylist(ROWS), parquet)
    return jsonl, parquet


def test_gsm8k_files_prompts_and_rewards(tmp_path):
    jsonl, parquet = _write(tmp_path)
    cfg = load_config(GPU, [f"data.train_file={jsonl}", f"data.eval_file={parquet}"])
    assert (cfg.data.prompt_column, cfg.data.answer_column) == ("question", "answer")
    assert [r.name for r in cfg.rewards] == ["gsm8k", "format"] and cfg.data.chat_template
    train, test = load_examples(cfg.data, "train"), load_examples(cfg.data, "eval")
    for split in (train, test):
        assert [e["prompt"] for e in split] == [r["question"] for r in ROWS]
        assert [e["answer"] for e in split] == [r["answer"] for r in ROWS]

    # The prompt the sampler sees: the question as one user turn of the chat template, with the
    # generation prompt appended (the packaged tokenizer's template: "user: ...\nassistant: ").
    tok = load_tokenizer(None)
    it = make_prompt_iterator(train, tokenizer=tok, shuffle=False, num_epochs=1,
                              chat_template=cfg.data.chat_template)
    first = next(it)
    text = tok.decode(first["prompt_ids"], skip_special_tokens=True)
    assert text == f"user: {ROWS[0]['question']}\nassistant: "
    assert first["answer"] == ROWS[0]["answer"]

    fns = [RewardFn.from_name(r.name, r.weight) for r in cfg.rewards]
    completions = [
        "She sold 24 in May, so 48 + 24 = 72.\n#### 72",  # right, well formed: 1 + 0.1
        "12 x 50 / 60 = 10, so the answer is \\boxed{10}",  # right, no '####' line: 1
        "48 + 48 = 96\n#### 96",  # wrong, well formed: 0.1
        "I am not sure.",  # neither: 0
    ]
    answers = [ROWS[0]["answer"], ROWS[1]["answer"], ROWS[0]["answer"], ROWS[1]["answer"]]
    res = compute_rewards(fns, ["q"] * 4, completions, {"answer": answers},
                          on_error=cfg.reward_on_error)
    assert res.per_fn["gsm8k"].tolist() == [1.0, 1.0, 0.0, 0.0]
    assert res.per_fn["format"].tolist() == [1.0, 0.0, 1.0, 0.0]
    assert [round(float(x), 3) for x in res.total] == [1.1, 1.0, 0.1, 0.0]
