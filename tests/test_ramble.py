"""The `ramble` task: determinism, verifier and a heavy-tailed length distribution."""

from __future__ import annotations

import collections

import numpy as np
import pytest

from sagc_jax.data.ramble import (
    ENDLESS_CHARS,
    RambleSource,
    ramble_example,
    ramble_kind,
    solve_chain,
    verify_ramble,
)
from sagc_jax.data.tasks import check_arith_solution, get_task, prompt_split
from sagc_jax.rewards.answers import exact_answer_reward


@pytest.fixture(scope="module")
def train3k():
    return list(get_task("ramble").train_examples(seed=0, n=3000))


def test_deterministic_and_registered(train3k):
    src = RambleSource(3000, 0, split="train")
    assert src[1234] == train3k[1234] and src[-1] == train3k[-1] and src[5:8] == train3k[5:8]
    assert list(RambleSource(40, 1, split="train")) != train3k[:40]
    assert ramble_example(17, 0) == train3k[17]
    with pytest.raises(IndexError):
        src[3000]
    with pytest.raises(ValueError, match="ramble_rate"):
        get_task("ramble", ramble_rate=1.5)
    ev = get_task("ramble").eval_examples(200)
    assert ev == get_task("ramble").eval_examples(200)
    assert all(prompt_split(e["prompt"]) == "eval" and e["ramble"] == "clean" for e in ev)
    assert not {e["prompt"] for e in ev} & {e["prompt"] for e in train3k}


def test_verifier_and_reward_agree(train3k):
    kinds = collections.Counter(e["ramble"] for e in train3k)
    assert kinds["finite"] > 30 and kinds["endless"] > 30  # both kinds of ramble occur
    prompts = [e["prompt"] for e in train3k]
    sols = [e["solution"] for e in train3k]
    reward = exact_answer_reward(prompts, sols, answer=[e["answer"] for e in train3k])
    for e, r in zip(train3k, reward):
        assert solve_chain(e["prompt"]) == int(e["answer"])  # answer is always the true one
        assert verify_ramble(e["prompt"], e["solution"]) == (r == 1.0)
        assert ramble_kind(e["prompt"], e["solution"]) == e["ramble"]
        if e["ramble"] == "clean":
            assert check_arith_solution(e["prompt"], e["solution"]) and r == 1.0
        elif e["ramble"] == "endless":
            assert "####" not in e["solution"] and len(e["solution"]) >= ENDLESS_CHARS - 8
            assert r == 0.0
        else:  # a finite ramble answers the running total where it looped
            lines = e["solution"].split("\n")
            assert lines[-2] == lines[-3] and lines[-1] == f"#### {lines[-2].split('=')[1]}"
            assert (r == 1.0) == (lines[-2].split("=")[1] == e["answer"])
    # Rambles are wrong almost always (a loop on the last step still answers correctly).
    wrong = [r for e, r in zip(train3k, reward) if e["ramble"] != "clean"]
    assert np.mean(wrong) < 0.3
    assert verify_ramble("7+5-3=", "7+5=12\n12-3=9\n#### 9")
    assert not verify_ramble("7+5-3=", "7+5=12\n12-3=9\n12-3=9\n12-3")  # truncated
    assert not verify_ramble("7+5-3=", "7+5=12\n7+5=12\n#### 12")
    with pytest.raises(ValueError, match="chain prompt"):
        solve_chain("=")


def test_length_distribution_heavy_tail(train3k):
    lens = np.array([len(e["solution"]) for e in train3k])
    clean = np.array([len(e["solution"]) for e in train3k if e["ramble"] == "clean"])
    med = np.median(lens)
    # Most demonstrations are short, a few run to the cap: p99 / median far above a clean
    # solution's, and the share beyond 3x the median is several times the clean share.
    assert np.percentile(lens, 99) > 6 * med
    assert np.percentile(clean, 99) < 4 * np.median(clean)
    share = np.mean(lens > 3 * med)
    assert share > 2 * np.mean(clean > 3 * med) and 0.03 < share < 0.15
    assert np.mean(lens >= 128) > 0.02  # endless rambles pass the CPU configs' cap


def test_ramble_rate_from_the_config():
    """`data.task_ramble_rate` reaches the task (share of rambling SFT demonstrations), and is
    refused, naming the key, for any other task."""
    from sagc_jax.config import ConfigError, load_config
    from sagc_jax.data.pipeline import load_examples

    base = "configs/straggle_cpu.yaml"
    share = {}
    for rate in (None, 0.02):
        cfg = load_config(base, [] if rate is None else [f"data.task_ramble_rate={rate}"])
        ex = load_examples(cfg, "train")
        share[rate] = np.mean([ex[i]["ramble"] != "clean" for i in range(4000)])
    assert 0.045 < share[None] < 0.075 and 0.01 < share[0.02] < 0.03
    with pytest.raises(ConfigError, match=r"data\.task_ramble_rate"):
        load_config("configs/tiny_cpu.yaml", ["data.task_ramble_rate=0.02"])
