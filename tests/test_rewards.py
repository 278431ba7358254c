"""Tests for sagc_jax.rewards."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sagc_jax.rewards import (
    BUILTIN_REWARDS,
    RewardError,
    RewardFn,
    RewardNameError,
    build_reward_fns,
    compute_rewards,
    resolve_reward,
)
from sagc_jax.rewards.answers import (
    exact_answer_reward,
    extract_gsm8k_answer,
    format_reward,
    gsm8k_reward,
    normalize_number,
)

# A module-level function for the "module:function" form.


def const_reward(prompts, completions, **kwargs):
    return [0.5] * len(completions)


NOT_CALLABLE = 3


def test_exact_answer():
    comps = ["1+2=3\n#### 3", "#### 4", "no answer", "1+2=3\n#### 3\n#### 9", "####  03"]
    assert exact_answer_reward([""] * 5, comps, answer=["3", "3", "3", "3", 3]) == [
        1.0,
        0.0,
        0.0,
        1.0,
        1.0,
    ]
    with pytest.raises(ValueError, match="needs an 'answer' column"):
        exact_answer_reward(["p"], ["#### 1"])


def test_exact_answer_on_task_solutions():
    from sagc_jax.data.tasks import make_arith_examples

    exs = make_arith_examples(200, seed=0)
    sols = [e["solution"] for e in exs]
    answers = [e["answer"] for e in exs]
    assert exact_answer_reward([e["prompt"] for e in exs], sols, answer=answers) == [1.0] * 200
    assert format_reward([], sols) == [1.0] * 200
    shifted = answers[1:] + answers[:1]
    assert sum(exact_answer_reward([""] * 200, sols, answer=shifted)) < 200


@pytest.mark.parametrize(
    ("text", "num"),
    [
        ("42", "42"),
        ("42.0", "42"),
        ("42.50", "42.5"),
        ("$1,234", "1234"),
        ("-3", "-3"),
        ("7.", "7"),
        ("\\$5", "5"),
        ("abc", None),
        ("50%", "50"),
    ],
)
def test_normalize_number(text, num):
    assert normalize_number(text) == num


def test_gsm8k():
    ref = "She has 3 apples.\nThen 2 more.\n#### 1,000"
    assert extract_gsm8k_answer(ref) == "1000"
    comps = [
        "so the answer is #### 1000",
        "The answer is \\boxed{1,000}.",
        "I think 3 then 1000.00",
        "The answer is $1000.",
        "#### 999",
        "\\boxed{\\$1000} and later 5",
        "nothing",
    ]
    assert gsm8k_reward([""] * 7, comps, answer=[ref] * 7) == [1, 1, 1, 1, 0, 1, 0]
    assert gsm8k_reward(["", ""], ["#### -4", "x = -4.50"], answer=["-4", "-4.5"]) == [1, 1]
    assert gsm8k_reward([""], ["\\boxed{\\frac{1}{2}}"], answer=["0.5"]) == [0.0]


def test_format():
    comps = [
        "a\n#### 12",
        "#### -3\n",
        "#### 1,000.5",
        "#### 12 apples",
        "#### 3\nmore",
        "####",
        "x #### 3",
    ]
    assert format_reward([""] * 7, comps) == [1, 1, 1, 0, 0, 0, 0]


def test_resolve_reward():
    assert resolve_reward("gsm8k") is gsm8k_reward
    assert resolve_reward(f"{__name__}:const_reward") is const_reward
    with pytest.raises(ValueError, match="unknown reward 'nope'; built-ins: exact_answer, format"):
        resolve_reward("nope")
    with pytest.raises(ValueError, match="cannot import module 'no_such_mod_xyz'"):
        resolve_reward("no_such_mod_xyz:f")
    with pytest.raises(ValueError, match="has no attribute 'missing'"):
        resolve_reward(f"{__name__}:missing")
    with pytest.raises(ValueError, match="'NOT_CALLABLE' is not callable"):
        resolve_reward(f"{__name__}:NOT_CALLABLE")
    assert set(BUILTIN_REWARDS) == {"exact_answer", "gsm8k", "format", "math_verify",
                                    "reasoning_gym", "reasoning_gym_strict"}


def test_reward_names_of_the_modules_before_the_rewards_package():
    """A config naming a built-in by its old dotted path gets one line with the new one."""
    with pytest.raises(RewardNameError, match=r"reward 'sagc_jax.rl.rewards:gsm8k_reward': "
                       r"module 'sagc_jax.rl.rewards' moved to sagc_jax.rewards; use "
                       r"'sagc_jax.rewards.answers:gsm8k_reward' \(or a built-in name: "):
        resolve_reward("sagc_jax.rl.rewards:gsm8k_reward")
    with pytest.raises(RewardNameError,
                       match=r"use 'sagc_jax\.rewards\.verifiers:math_verify_reward'"):
        resolve_reward("sagc_jax.rl.verifiers:math_verify_reward")
    with pytest.raises(RewardNameError, match=r"use 'sagc_jax\.rewards' \("):
        resolve_reward("sagc_jax.rl.answer_rewards:normalize_number")
    assert resolve_reward("sagc_jax.rewards.answers:format_reward") is BUILTIN_REWARDS["format"]


def test_reward_module_in_the_current_directory(tmp_path, monkeypatch):
    """As the installed `sagc-jax` script runs it: the working directory is not on sys.path."""
    import os
    import sys

    (tmp_path / "cwd_reward_mod_xyz.py").write_text("def score(prompts, completions, **kw):\n"
                                                    "    return [0.5] * len(completions)\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", os.getcwd())])
    fn = resolve_reward("cwd_reward_mod_xyz:score")
    assert fn(["p"], ["c"]) == [0.5]
    with pytest.raises(RewardNameError, match=rf"no module 'nope_xyz' in the current directory "
                                              rf"\({tmp_path}\)"):
        resolve_reward("nope_xyz:f")


def test_build_reward_fns():
    fns = build_reward_fns({"exact_answer": 1.0, "format": 0.2})
    assert [(f.name, f.weight) for f in fns] == [("exact_answer", 1.0), ("format", 0.2)]
    assert build_reward_fns("gsm8k")[0].fn is gsm8k_reward
    fns = build_reward_fns([{"name": "format", "weight": 2}, "exact_answer"])
    assert [(f.name, f.weight) for f in fns] == [("format", 2.0), ("exact_answer", 1.0)]
    with pytest.raises(ValueError, match="more than once"):
        build_reward_fns(["format", "format"])
    from sagc_jax.config import Config

    fns = build_reward_fns(Config().rewards)
    assert fns and all(isinstance(f, RewardFn) for f in fns)


def test_compute_rewards_weighted():
    fns = [
        RewardFn.from_name("exact_answer", 1.0),
        RewardFn.from_name("format", 0.5),
        RewardFn("const", const_reward, 2.0),
    ]
    res = compute_rewards(fns, ["p", "q"], ["x\n#### 3", "#### 4 ok"], {"answer": ["3", "4"]})
    assert res.total.dtype == np.float32 and res.total.shape == (2,)
    np.testing.assert_allclose(res.total, [1 + 0.5 + 1.0, 1 + 0 + 1.0])
    np.testing.assert_allclose(res.per_fn["format"], [1.0, 0.0])
    assert res.num_errors == 0 and res.messages == []
    with pytest.raises(ValueError, match="column 'answer' has 1 values for 2 completions"):
        compute_rewards(fns, ["p", "q"], ["a", "b"], {"answer": ["3"]})


def _raises_on_bad(prompts, completions, **kw):
    out = []
    for c in completions:
        if c == "bad":
            raise KeyError("boom")
        out.append(1.0)
    return out


def _wrong_length(prompts, completions, **kw):
    return [1.0] * (len(completions) + 1)


def _non_finite(prompts, completions, **kw):
    return [math.nan if c == "bad" else 1.0 for c in completions]


def _batch_only(prompts, completions, **kw):
    if len(completions) > 1:
        raise RuntimeError("batch too big")
    return [1.0]


def _none_and_text(prompts, completions, **kw):
    return [None if c == "none" else ("x" if c == "bad" else 1.0) for c in completions]


COMPS = ["ok", "ok", "bad", "ok", "bad"]


def test_reward_raises():
    fns = [RewardFn("boom", _raises_on_bad)]
    with pytest.raises(RewardError, match=r"reward 'boom' failed on example 2: raised KeyError"):
        compute_rewards(fns, [""] * 5, COMPS, {})
    res = compute_rewards(fns, [""] * 5, COMPS, {}, on_error="zero")
    np.testing.assert_array_equal(res.total, [1, 1, 0, 1, 0])
    assert res.num_errors == 2 and len(res.messages) == 1
    assert "reward 'boom' failed on example 2" in res.messages[0]
    assert "set to 0" in res.messages[0]


def test_reward_wrong_length():
    fns = [RewardFn("long", _wrong_length), RewardFn("ok", const_reward)]
    with pytest.raises(RewardError, match=r"reward 'long' returned 6 values for 5 completions"):
        compute_rewards(fns, [""] * 5, COMPS, {})
    res = compute_rewards(fns, [""] * 5, COMPS, {}, on_error="zero")
    np.testing.assert_array_equal(res.per_fn["long"], np.zeros(5))
    np.testing.assert_allclose(res.total, np.full(5, 0.5))
    assert res.num_errors == 5 and "returned 6 values for 5 completions" in res.messages[0]


def test_reward_non_finite():
    fns = [RewardFn("nan", _non_finite)]
    with pytest.raises(
        RewardError,
        match=r"reward 'nan' returned a bad value for example 2: "
        r"non-finite value nan \(and 1 more\)",
    ):
        compute_rewards(fns, [""] * 5, COMPS, {})
    res = compute_rewards(fns, [""] * 5, COMPS, {}, on_error="zero")
    np.testing.assert_array_equal(res.total, [1, 1, 0, 1, 0])
    assert res.num_errors == 2 and np.isfinite(res.total).all()


def test_reward_batch_only_failure_and_non_numeric():
    with pytest.raises(RewardError, match="no single example reproduces it"):
        compute_rewards([RewardFn("b", _batch_only)], ["", ""], ["a", "b"], {})
    res = compute_rewards([RewardFn("b", _batch_only)], ["", ""], ["a", "b"], {}, on_error="zero")
    assert res.num_errors == 2 and res.total.tolist() == [0, 0]
    fns = [RewardFn("t", _none_and_text)]
    with pytest.raises(RewardError, match="example 1: non-numeric value 'x'"):
        compute_rewards(fns, [""] * 3, ["none", "bad", "ok"], {})
    res = compute_rewards(fns, [""] * 3, ["none", "ok", "ok"], {})
    assert res.total.tolist() == [0.0, 1.0, 1.0] and res.num_errors == 0  # None → 0 (TRL)
    # A row every function scores None is unscored: NaN for the learner (out of group stats).
    assert res.scored.tolist() == [False, True, True]
    two = [RewardFn("t", _none_and_text), RewardFn("two", lambda p, c, **k: [2.0] * len(c))]
    both = compute_rewards(two, [""] * 3, ["none", "ok", "ok"], {})
    assert both.scored.all() and both.total.tolist() == [2.0, 3.0, 3.0]  # None → 0 if others score
    with pytest.raises(ValueError, match="on_error"):
        compute_rewards(fns, [""], ["ok"], {}, on_error="ignore")
