"""reasoning-gym tasks (`data.task: reasoning_gym`) and the verifier rewards `reasoning_gym`,
`reasoning_gym_strict` and `math_verify`: deterministic prompts, disjoint splits, each
dataset's own `score_answer`, the fallback extraction, option errors, and a tiny training run."""

from __future__ import annotations

import pickle
import threading

import numpy as np
import pytest
from reasoning_gym import create_dataset

from sagc_jax.config import ConfigError, load_config
from sagc_jax.data.pipeline import load_examples
from sagc_jax.data.reasoning_gym import question_split
from sagc_jax.data.tasks import get_task
from sagc_jax.rewards import RewardFn, score_groups
from sagc_jax.rewards.verifiers import (
    answer_candidates,
    math_verify_reward,
    reasoning_gym_reward,
    reasoning_gym_strict_reward,
)

# Few distinct questions (2 one-digit terms): the hash split must still keep them apart.
SMALL = {"chain_sum": {"weight": 1, "min_terms": 2, "max_terms": 2, "max_digits": 1}}
MIX = {
    "chain_sum": {"weight": 2, "min_terms": 2, "max_terms": 3},
    "leg_counting": {"weight": 1, "max_animals": 3},
    "basic_arithmetic": {"weight": 1, "max_terms": 3, "max_digits": 2},
    "spell_backward": {"weight": 1},
    "number_sorting": {"weight": 1, "max_numbers": 4},
    "gsm_symbolic": {"weight": 1},
}


@pytest.fixture(scope="module")
def mix_task():
    return get_task("reasoning_gym", datasets=MIX, system_prompt="default")


@pytest.fixture(scope="module")
def mix_train(mix_task):
    src = mix_task.train_examples(seed=0, n=10_000)
    return [src[i] for i in range(300)]


def test_prompts_are_deterministic_and_carry_the_instruction(mix_task, mix_train):
    again = get_task("reasoning_gym", datasets=MIX, system_prompt="default")
    assert [again.train_examples(0, 10_000)[i] for i in range(40)] == mix_train[:40]
    assert again.eval_examples(30) == mix_task.eval_examples(30)
    other = [ex["prompt"] for ex in mix_task.train_examples(1, 10_000)[:40]]
    assert other != [ex["prompt"] for ex in mix_train[:40]]  # the seed matters
    assert {ex["rg_dataset"] for ex in mix_train} == set(MIX)
    for ex in mix_train[:50]:
        assert "<answer>answer here</answer>" in ex["prompt"]  # reasoning-gym's default prompt
        assert ex["prompt"].endswith(ex["rg_entry"]["question"])
        assert ex["solution"] == f"<answer>{ex['answer']}</answer>"
    bare = get_task("reasoning_gym", datasets=SMALL, system_prompt=None).train_examples(0, 10)
    assert bare[0]["prompt"] == bare[0]["rg_entry"]["question"]
    # extra_instruction goes after the system prompt, before the question, blank-line apart
    from reasoning_gym.utils import SYSTEM_PROMPTS

    tool = get_task("reasoning_gym", datasets=SMALL, extra_instruction="Use <calc>.\n")
    ex = tool.train_examples(0, 1)[0]
    assert ex["prompt"] == (SYSTEM_PROMPTS["default"].strip() + "\n\nUse <calc>.\n\n"
                            + ex["rg_entry"]["question"])
    only = get_task("reasoning_gym", datasets=SMALL, system_prompt=None, extra_instruction="Hi")
    assert only.train_examples(0, 1)[0]["prompt"] == "Hi\n\n" + ex["rg_entry"]["question"]


def test_calc_rate_writes_calculator_tool_traces_that_the_calculator_agrees_with():
    from sagc_jax.envs import Calculator, evaluate

    mix = {"chain_sum": {"min_terms": 2, "max_terms": 3, "max_digits": 2},
           "leg_counting": {}}  # no `expression` in its metadata: never a tool trace
    exs = get_task("reasoning_gym", datasets=mix, calc_rate=0.5).train_examples(0, 400)
    traces = [ex for ex in exs if isinstance(ex["solution"], list)]
    sums = [ex for ex in exs if ex["rg_dataset"] == "chain_sum"]
    assert 0.35 < len(traces) / len(sums) < 0.65
    assert all(ex["rg_dataset"] == "chain_sum" for ex in traces)
    for ex in traces:
        call, reply, answer = ex["solution"]
        assert Calculator().step(call).observation == reply == f"={ex['answer']}\n"
        assert evaluate(call[len("<calc>"):-len("</calc>")]) == ex["answer"]
        assert answer == f"<answer>{ex['answer']}</answer>"
    none = get_task("reasoning_gym", datasets=mix).train_examples(0, 50)
    assert not any(isinstance(ex["solution"], list) for ex in none)


def test_train_and_heldout_are_disjoint_even_with_few_distinct_questions():
    task = get_task("reasoning_gym", datasets=SMALL, system_prompt=None)
    heldout = task.eval_examples(60)
    train = task.train_examples(seed=0, n=2000)
    train_q = {train[i]["rg_entry"]["question"] for i in range(2000)}
    heldout_q = {ex["rg_entry"]["question"] for ex in heldout}
    assert len(heldout) == 60 and len(train_q) > 50  # the space is small but both are real
    assert not train_q & heldout_q
    assert all(question_split(q) == "eval" for q in heldout_q)


def _score(ex: dict, completion: str) -> float:
    """reasoning-gym's own verifier, built from the dataset's settings."""
    import json

    ds = create_dataset(ex["rg_dataset"], **json.loads(ex["rg_config"]), seed=0, size=1)
    return float(ds.score_answer(completion, ex["rg_entry"]))


def _cols(exs: list[dict]) -> dict:
    return {"rg_entry": [e["rg_entry"] for e in exs], "rg_config": [e["rg_config"] for e in exs]}


def test_reward_uses_each_datasets_verifier(mix_train):
    by_name = {}
    for ex in mix_train:
        by_name.setdefault(ex["rg_dataset"], ex)
    assert set(by_name) == set(MIX)
    exs = list(by_name.values())
    right = [f"Step by step...\n<answer>{e['answer']}</answer>" for e in exs]
    wrong = ["<answer>qqqq</answer>" for _ in exs]
    malformed = ["" for _ in exs]
    for comps, want in ((right, 1.0), (wrong, 0.0), (malformed, 0.0)):
        got = reasoning_gym_reward([""] * len(exs), comps, **_cols(exs))
        assert got == [want] * len(exs), (comps, got)
    # the same numbers as calling score_answer directly on the extracted answer
    assert [_score(e, e["answer"]) for e in exs] == [1.0] * len(exs)


def test_fallback_extraction_and_strict_variant(mix_train):
    ex = next(e for e in mix_train if e["rg_dataset"] == "chain_sum")
    a = ex["answer"]
    cases = {  # completion -> (lenient, strict)
        f"I add them up.\nSo the total is\n{a}": (1.0, 0.0),  # last line
        f"the answer is {a}.": (1.0, 0.0),  # last number
        f"<answer>{a}": (1.0, 0.0),  # cut off before the closing tag
        f"<answer>{a}</answer> no wait\n<answer>{int(a) + 1}</answer>": (0.0, 0.0),  # last tag
        f"<answer>{int(a) + 1}</answer>\n{a}": (0.0, 0.0),  # a tag wins over the fallback
        f"<answer> {a} </answer>": (1.0, 1.0),
    }
    comps = list(cases)
    cols = _cols([ex] * len(comps))
    assert reasoning_gym_reward([""] * len(comps), comps, **cols) == [v[0] for v in cases.values()]
    assert reasoning_gym_strict_reward([""] * len(comps), comps, **cols) == \
        [v[1] for v in cases.values()]
    assert answer_candidates("x\n\n  y 12 z  \n") == ["y 12 z", "12"]
    with pytest.raises(ValueError, match="rg_entry"):
        reasoning_gym_reward([""], ["<answer>1</answer>"], answer=["1"])


def test_math_verify_latex_and_numbers():
    cases = [  # (reference, completion, reward)
        ("\\frac{1}{2}", "so the answer is $\\boxed{0.5}$", 1.0),
        ("$\\frac{1}{2}$", "The answer is \\boxed{\\frac{2}{4}}", 1.0),
        ("42", "5 * 8 + 2 = 42\n#### 42", 1.0),
        ("7", "thinking...\n<answer>7</answer>", 1.0),
        ("7", "<answer>8</answer>", 0.0),
        ("x^2 + 1", "$1 + x^2$", 1.0),
        ("3", "no idea", 0.0),
        ("1,000", "<answer>1000</answer>", 1.0),
        ("", "42", None),  # no reference: not applicable
    ]
    refs, comps, want = zip(*cases)
    assert math_verify_reward([""] * len(cases), list(comps), answer=list(refs)) == list(want)
    out = []  # off the main thread math-verify's signal.alarm limit is off, not an error -> 0
    t = threading.Thread(target=lambda: out.append(
        math_verify_reward([""], ["\\boxed{0.5}"], answer=["\\frac12"])))
    t.start()
    t.join()
    assert out == [[1.0]]


@pytest.mark.parametrize("options, match", [
    ({"datasets": {"chain_sums": {}}}, r"datasets: unknown reasoning-gym dataset 'chain_sums' "
                                        r"\(did you mean 'chain_sum'\?\)"),
    ({"datasets": {"chain_sum": {"min_term": 2}}}, r"unknown key 'data\.task_options\.datasets"
                                                   r"\.chain_sum\.min_term' \(did you mean "
                                                   r"'data\.task_options\.datasets\.chain_sum"
                                                   r"\.min_terms'\?\)"),
    ({"datasets": {"chain_sum": {"min_terms": 0}}}, r"datasets\.chain_sum: reasoning-gym rejects"
                                                    r" these settings: min_terms must be "
                                                    r"positive"),
    ({"datasets": {"chain_sum": {"seed": 3}}}, r"datasets\.chain_sum\.seed: set by the task"),
    ({"datasets": {"chain_sum": {"weight": -1}}},
     r"chain_sum\.weight: must be a finite number > 0"),
    ({"datasets": [{"name": "leg_counting", "config": {"max_animal": 2}}]},
     r"leg_counting\.max_animal' \(did you mean '.*max_animals'\?\)"),
    ({"datasets": {"chain_sum": {}}, "system_prompt": "defualt"},
     r"system_prompt: unknown 'defualt' \(did you mean 'default'\?\)"),
    ({"datasets": {"chain_sum": {}}, "extra_instruction": 3},
     r"task_options\.extra_instruction: expected non-empty text or null, got 3"),
    ({"datasets": {"chain_sum": {}}, "calc_rate": 1.5},
     r"task_options\.calc_rate: expected a number in \[0, 1\], got 1\.5"),
    ({"dataset": {"chain_sum": {}}}, r"unknown key 'data\.task_options\.dataset' \(did you mean "
                                     r"'data\.task_options\.datasets'\?\)"),
    ({}, r"data\.task_options\.datasets: required"),
])
def test_bad_options_are_one_line_errors_naming_task_options(options, match):
    with pytest.raises(ConfigError, match=match) as info:
        get_task("reasoning_gym", **options)
    msg = str(info.value)
    assert "data.task_options" in msg and "\n" not in msg


def test_config_path_grain_and_columns(tmp_path):
    """Through a config: the held-out split has data.num_eval problems, and a training example
    that went through the grain pipeline (and pickling, as for grain workers) scores 1 with its
    reference solution."""
    from sagc_jax.data.pipeline import make_prompt_iterator
    from sagc_jax.data.tokenizer import load_tokenizer
    from sagc_jax.evaluate import load_eval_examples

    cfg = load_config("configs/tiny_cpu.yaml", [
        "data.task=reasoning_gym", "data.num_eval=12",
        "data.task_options={system_prompt: simple, datasets: {leg_counting: {min_animals: 1, "
        "max_animals: 2}, spell_backward: {weight: 2}}}"])
    heldout = load_examples(cfg, "eval")
    assert len(heldout) == 12 and all(question_split(e["rg_entry"]["question"]) == "eval"
                                      for e in heldout)
    # `sagc-jax eval` on such a run: the same held-out set, by run config or by task name
    assert load_eval_examples(None, cfg)[0] == heldout
    assert load_eval_examples("reasoning_gym", cfg) == (heldout, "reasoning_gym")
    src = pickle.loads(pickle.dumps(load_examples(cfg, "train")))
    it = make_prompt_iterator(src, tokenizer=load_tokenizer(), seed=0)
    exs = [next(it) for _ in range(6)]
    assert all(ex["prompt_ids"].dtype == np.int32 for ex in exs)
    res = score_groups([RewardFn.from_name("reasoning_gym")], exs, 1,
                       [ex["solution"] for ex in exs])
    assert res.total.tolist() == [1.0] * 6
    bad = load_config("configs/tiny_cpu.yaml", [
        "data.task=reasoning_gym", "data.task_options={datasets: {leg_count: {}}}"])
    with pytest.raises(ConfigError, match=r"data\.task_options\.datasets: unknown .*leg_count"):
        load_examples(bad, "train")


_TRAIN_OPTIONS = {"system_prompt": None, "datasets": {"basic_arithmetic": {
    "min_terms": 2, "max_terms": 2, "max_digits": 1, "operators": ["+"], "allow_negation": False,
    "allow_parentheses": False}}}
# A ~80k-parameter char-level model on one-digit additions ("Calculate 3 + 6." ->
# "<answer>9</answer>"): 17-token prompts, 19-token answers.
TRAIN = [
    "model.hidden_size=64", "model.intermediate_size=128", "model.num_layers=2",
    "model.num_heads=2", "model.num_kv_heads=1", "data.task=reasoning_gym",
    "data.task_options={system_prompt: null, datasets: {basic_arithmetic: {min_terms: 2, "
    "max_terms: 2, max_digits: 1, operators: ['+'], allow_negation: false, "
    "allow_parentheses: false}}}",
    "data.prompts_per_step=4", "data.num_eval=8", "sagc.group_sizes=[8]",
    "sagc.initial_group_size=8", "sagc.timing=model", "sampling.max_new_tokens=24",
    "sampling.prompt_buckets=[32]", "sampling.decode_chunk=8", "init.sft_steps=150",
    "init.sft_batch_size=16", "init.sft_lr=3e-3", "optim.lr=1e-3", "optim.warmup_steps=0",
    "checkpoint.every=0", "run.progress=false", "run.plots=false", "run.steps=6",
    "rewards=[{name: reasoning_gym_strict, weight: 1.0}]",
]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    from sagc_jax.cli import main

    run_dir = tmp_path_factory.mktemp("rg") / "run"
    assert main(["train", *TRAIN, f"run.dir={run_dir}"]) == 0
    return run_dir


def test_a_reasoning_gym_task_trains_with_the_tiny_model(tiny_run):
    """SFT warm start on `<answer>N</answer>` references, then GRPO steps scored by
    reasoning-gym's own verifier (strict: only a tagged answer counts).

    What is asserted: the run finishes; the warm-started model writes the answer format (mean
    length ~ the 19-token `<answer>N</answer>` + EOS, few truncations) and some of its answers
    are verified correct (reward > 0). Why not "reward rises": 150 SFT steps teach this model
    the format but not the sums (its answer digit is close to a guess, reward ~0.05), and 6
    GRPO steps of 32 rows cannot move that measurably above sampling noise (std ~0.04 per step);
    a rise needs hundreds of steps, minutes on CPU, beyond a CI test.
    """
    from sagc_jax.metrics import read_jsonl

    rows = read_jsonl(tiny_run / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, 7))
    rewards = np.array([r["reward_mean"] for r in rows])
    assert np.all((rewards >= 0) & (rewards <= 1)) and rewards.sum() > 0
    assert all(r["reward_errors"] == 0 for r in rows)
    assert 17 <= np.mean([r["len_mean"] for r in rows]) <= 22
    assert np.mean([r["truncated_frac"] for r in rows]) < 0.25


def test_cli_eval_of_the_run_scores_the_heldout_split(tiny_run, tmp_path):
    """`sagc-jax eval` on the run: the held-out problems of its config, greedy completions in
    the SFT'd format, scored by the run's reward."""
    import json
    import re

    from sagc_jax.cli import main

    out = tmp_path / "eval.json"
    assert main(["eval", "--checkpoint", str(tiny_run), "--limit", "4", "--num-samples", "0",
                 "--no-progress", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["correct_reward"] == "reasoning_gym_strict" and res["reward_errors"] == 0
    assert res["num_prompts"] == 4
    heldout = {e["prompt"] for e in get_task("reasoning_gym", **_TRAIN_OPTIONS).eval_examples(4)}
    assert {p["prompt"] for p in res["per_prompt"]} == heldout
    assert all(re.fullmatch(r"<answer>\d+</answer>", p["greedy"]) for p in res["per_prompt"])


def test_dry_run_reports_bad_task_options():
    from sagc_jax.dryrun import dry_run

    ok = load_config("configs/tiny_cpu.yaml", [
        "data.task=reasoning_gym", "data.task_options={datasets: {chain_sum: {max_terms: 3}}}"])
    assert dry_run(ok, num_devices=1)["checks"]["data.task_options"] == "ok"
    bad = load_config("configs/tiny_cpu.yaml", [
        "data.task=reasoning_gym", "data.task_options={datasets: {chain_sum: {max_term: 3}}}"])
    r = dry_run(bad, num_devices=1)
    assert not r["ok"]
    assert any(e.startswith("data.task_options: unknown key 'data.task_options.datasets."
                            "chain_sum.max_term'") for e in r["errors"]), r["errors"]
    missing = load_config("configs/tiny_cpu.yaml", ["data.task=reasoning_gym"])
    assert any(e.startswith("data.task_options.datasets: required")
               for e in dry_run(missing, num_devices=1)["errors"])
