"""`load_policy` / `evaluate` / `export` and the `eval` / `export` commands.

A tiny run directory (hidden 32, 2 layers) is written without the trainer: config.yaml via
`save_config`, then two steps and `initial` through the trainer's own `RunCheckpointer`, so the
on-disk layout is exactly a real run's. Every evaluate call uses the same sampler shapes
(k=3, 3 prompts per call, 16 new tokens) so programs compile once per session.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import pathlib
import re
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from hf_fixtures import tiny_hf_dir  # noqa: F401  (session fixture)

from sagc_jax import checkpoint as ckpt
from sagc_jax.cli import main
from sagc_jax.config import config_from_dict, load_config, save_config
from sagc_jax.data.pipeline import make_prompt_iterator
from sagc_jax.data.tasks import get_task
from sagc_jax.data.tokenizer import load_tokenizer
from sagc_jax.evaluate import evaluate, load_eval_examples, pass_at_k
from sagc_jax.export import export
from sagc_jax.models.build import build_model
from sagc_jax.open_run import (
    CONFIG_IN_HF_DIR,
    CheckpointPathError,
    load_policy,
    resolve_checkpoint,
)
from sagc_jax.rewards import RewardFn

K, BATCH, NEW, CHUNK = 3, 3, 16, 8
STEPS = (2, 4)


def _params(model) -> dict:
    return jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.state(model, nnx.Param)))


def _assert_same(a: dict, b: dict) -> None:
    la, lb = jax.tree.leaves_with_path(a), jax.tree.leaves_with_path(b)
    assert [p for p, _ in la] == [p for p, _ in lb]
    for (p, x), (_, y) in zip(la, lb):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=str(p))


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> dict:
    """A run dir with checkpoints at STEPS (distinct params each) and `initial`."""
    run_dir = tmp_path_factory.mktemp("run")
    cfg = config_from_dict({
        "run": {"dir": str(run_dir), "seed": 3},
        "model": {"hidden_size": 32, "intermediate_size": 64, "num_layers": 2, "num_heads": 4,
                  "num_kv_heads": 2},
        "data": {"task": "arith_short", "num_eval": 5},
        "sampling": {"max_new_tokens": NEW, "decode_chunk": CHUNK, "prompt_buckets": [16]},
        "checkpoint": {"async_save": False},
    })
    save_config(cfg, run_dir / "config.yaml")
    tok = load_tokenizer(cfg.model.tokenizer)
    model, mcfg = build_model(cfg, len(tok), tok, None)
    _, params = nnx.split(model)
    opt_state = optax.adam(1e-3).init(params)
    data_iter = make_prompt_iterator([{"prompt": "1+1=", "answer": "2"}], tokenizer=tok)
    saver = ckpt.RunCheckpointer(run_dir / "checkpoints", every=1, keep=5, async_save=False)
    saver.save_initial(params, mcfg)
    saved = {"initial": jax.tree.map(np.asarray, nnx.to_pure_dict(params))}
    for step in STEPS:
        params = jax.tree.map(lambda x, s=step: x + 0.01 * s, params)  # distinct per step
        saver.save(step, ckpt.Snapshot(step, params, opt_state, {"x": np.zeros(2)}, data_iter),
                   force=True)
        saved[step] = jax.tree.map(np.asarray, nnx.to_pure_dict(params))
    saver.wait()
    return {"dir": run_dir, "cfg": cfg, "saved": saved}


@pytest.fixture(scope="module")
def hf_dir(run, tmp_path_factory) -> pathlib.Path:
    return export(run["dir"], tmp_path_factory.mktemp("hf") / "model")


# ---------------------------------------------------------------------------------- loading


def test_load_policy_run_checkpoints_and_step_dirs(run):
    d, saved = run["dir"], run["saved"]
    newest = saved[max(STEPS)]
    for path in (d, d / "checkpoints", d / "checkpoints" / str(max(STEPS))):
        model, tok, cfg = load_policy(path)
        _assert_same(_params(model), newest)
        assert cfg == run["cfg"] and len(tok) == model.cfg.vocab_size
    model, _, _ = load_policy(d / "checkpoints" / str(STEPS[0]))
    _assert_same(_params(model), saved[STEPS[0]])
    model, _, _ = load_policy(d / "checkpoints" / "initial")
    _assert_same(_params(model), saved["initial"])


def test_resolve_errors_name_the_path(run, tmp_path):
    with pytest.raises(CheckpointPathError, match="does not exist"):
        resolve_checkpoint(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointPathError, match=re.escape(str(tmp_path / "empty"))):
        resolve_checkpoint(tmp_path / "empty")
    # Steps without the run config that describes the model.
    shutil.copytree(run["dir"] / "checkpoints", tmp_path / "orphan" / "checkpoints")
    with pytest.raises(CheckpointPathError, match=r"config\.yaml"):
        resolve_checkpoint(tmp_path / "orphan" / "checkpoints")


def test_mismatched_model_config_is_named(run, tmp_path):
    d = tmp_path / "run"
    shutil.copytree(run["dir"], d)
    cfg = load_config(d / "config.yaml", ["model.hidden_size=64"])
    save_config(cfg, d / "config.yaml")
    with pytest.raises(ckpt.CheckpointMismatchError, match="hidden_size"):
        load_policy(d)


# ---------------------------------------------------------------------------------- metrics


@pytest.mark.parametrize("n", [1, 2, 5, 6])
def test_pass_at_k_matches_brute_force(n):
    """Against the definition: P(some of k draws without replacement from n is correct)."""
    for c in range(n + 1):
        correct = [True] * c + [False] * (n - c)
        for k in range(1, n + 1):
            subsets = list(itertools.combinations(correct, k))
            brute = sum(any(s) for s in subsets) / len(subsets)
            assert len(subsets) == math.comb(n, k)
            assert pass_at_k(n, c, k) == pytest.approx(brute, abs=1e-12)
    with pytest.raises(ValueError):
        pass_at_k(n, n + 1, 1)


def _even_len(prompts, completions, **_):
    """A 'verifier' whose verdicts vary on an untrained model's output (and are recomputable)."""
    return [float(len(c) % 2 == 0) for c in completions]


def test_evaluate_metrics_are_consistent(run):
    model, tok, _ = load_policy(run["dir"])
    examples = get_task("arith_short").eval_examples(5)  # 5 prompts: batches of 3 and 2
    fns = [RewardFn("even_len", _even_len), RewardFn.from_name("exact_answer", 2.0)]
    r = evaluate(model, tok, examples, reward_fns=fns, num_samples=K, max_new_tokens=NEW,
                 temperature=1.0, batch_prompts=BATCH, seed=0, decode_chunk=CHUNK, details=True)
    assert r["num_prompts"] == 5 and r["num_samples"] == K
    per = r["per_prompt"]
    greedy_ok = [len(p["greedy"]) % 2 == 0 for p in per]
    assert r["accuracy"] == pytest.approx(np.mean(greedy_ok))
    counts = [p["num_correct"] for p in per]
    assert r["pass@1"] == pytest.approx(np.mean(counts) / K)
    assert r[f"pass@{K}"] == pytest.approx(np.mean([c > 0 for c in counts]))
    assert 0 <= r["pass@1"] <= r[f"pass@{K}"] <= 1
    assert 1 <= r["len_mean"] <= r["len_max"] <= NEW and r["sample_len_max"] <= NEW
    assert 0 <= r["truncated_frac"] <= 1 and 0 <= r["sample_truncated_frac"] <= 1
    # The summed reward includes the weighted exact_answer term on top of even_len.
    assert r["greedy_reward_mean"] >= r["accuracy"] - 1e-6
    # Greedy is deterministic; the same seed gives the same samples.
    again = evaluate(model, tok, examples, reward_fns=fns, num_samples=K, max_new_tokens=NEW,
                     batch_prompts=BATCH, seed=0, decode_chunk=CHUNK, details=True)
    assert [p["greedy"] for p in again["per_prompt"]] == [p["greedy"] for p in per]
    assert again["pass@1"] == r["pass@1"]


def test_default_eval_split_comes_from_the_run_config(run):
    examples, task = load_eval_examples(None, run["cfg"])
    assert task == "arith_short" and len(examples) == 5
    assert load_eval_examples("arith", None, limit=2)[0][0]["prompt"].endswith("=")


# ---------------------------------------------------------------------------------- export


def test_export_loads_in_transformers(run, hf_dir):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assert (hf_dir / "config.json").is_file() and (hf_dir / "model.safetensors").is_file()
    assert load_config(hf_dir / CONFIG_IN_HF_DIR) == run["cfg"]
    ours, tok, _ = load_policy(run["dir"])
    hf = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    hf_tok = AutoTokenizer.from_pretrained(hf_dir)
    ids = np.asarray([hf_tok.encode("<bos>7+5-3=", add_special_tokens=False)])
    assert ids.tolist() == [tok.encode("<bos>7+5-3=", add_special_tokens=False)]
    with torch.no_grad():
        ref = hf(torch.tensor(ids)).logits.numpy()
    np.testing.assert_allclose(np.asarray(ours(jnp.asarray(ids))), ref, atol=1e-4, rtol=0)
    with torch.no_grad():
        out = hf.generate(torch.tensor(ids), attention_mask=torch.ones_like(torch.tensor(ids)),
                          max_new_tokens=4, do_sample=False, pad_token_id=hf_tok.pad_token_id)
    assert out.shape[0] == 1 and 1 <= out.shape[1] - ids.shape[1] <= 4


def test_load_policy_on_hf_dir(run, hf_dir, tmp_path):
    model, tok, cfg = load_policy(hf_dir)
    _assert_same(_params(model), run["saved"][max(STEPS)])
    assert cfg == run["cfg"] and len(tok) == 101
    bare = tmp_path / "bare"
    shutil.copytree(hf_dir, bare)
    (bare / CONFIG_IN_HF_DIR).unlink()
    assert load_policy(bare)[2] is None


# ---------------------------------------------------------------------------------- CLI


def test_cli_eval_on_hf_dir_and_export(run, hf_dir, tmp_path, capsys):
    out = tmp_path / "r.json"
    rc = main(["eval", "--checkpoint", str(hf_dir), "--data", "arith_short", "--limit", "4",
               "--num-samples", str(K), "--batch-prompts", str(BATCH), "--no-progress",
               "--out", str(out)])
    assert rc == 0
    res = json.loads(out.read_text())
    assert res["num_prompts"] == 4 and len(res["per_prompt"]) == 4
    assert 0 <= res["pass@1"] <= res[f"pass@{K}"] <= 1
    assert "accuracy" in capsys.readouterr().out
    # A JSONL file as --data.
    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "2+2=", "answer": 4}\n')
    rc = main(["eval", "--checkpoint", str(run["dir"]), "--data", str(data), "--num-samples",
               "0", "--batch-prompts", str(BATCH), "--no-progress"])
    assert rc == 0 and "num_prompts" in capsys.readouterr().out
    assert main(["export", "--checkpoint", str(run["dir"]), "--out", str(tmp_path / "x")]) == 0
    assert (tmp_path / "x" / "model.safetensors").is_file()
    # A non-empty --out is refused without --force.
    assert main(["export", "--checkpoint", str(run["dir"]), "--out", str(tmp_path / "x")]) == 2


def _one_line_error(capsys, needle: str) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err, err
    return err


@pytest.mark.parametrize("cmd", ["eval", "export"])
def test_cli_bad_paths_exit_2(cmd, tmp_path, capsys):
    extra = ["--out", str(tmp_path / "o")] if cmd == "export" else []
    missing = tmp_path / "missing"
    assert main([cmd, "--checkpoint", str(missing), *extra]) == 2
    _one_line_error(capsys, str(missing))
    neither = tmp_path / "neither"
    neither.mkdir()
    (neither / "notes.txt").write_text("x")
    assert main([cmd, "--checkpoint", str(neither), *extra]) == 2
    _one_line_error(capsys, str(neither))


def test_cli_eval_bad_data_and_bare_hf_without_data(run, hf_dir, tmp_path, capsys):
    assert main(["eval", "--checkpoint", str(run["dir"]), "--data", "nope.jsonl"]) == 2
    _one_line_error(capsys, "nope.jsonl")
    bare = tmp_path / "bare"
    shutil.copytree(hf_dir, bare)
    (bare / CONFIG_IN_HF_DIR).unlink()
    assert main(["eval", "--checkpoint", str(bare)]) == 2
    _one_line_error(capsys, "--data")


# ---------------------------------------------------------------------------------- reliability


def test_eval_and_export_fall_back_past_a_corrupt_step(run, tmp_path, capsys, sagc_log):
    from test_checkpoint import flip_bytes

    d = tmp_path / "run"
    shutil.copytree(run["dir"], d)
    newest = d / "checkpoints" / str(max(STEPS))
    flip_bytes(newest)
    model, _, _ = load_policy(d)
    _assert_same(_params(model), run["saved"][STEPS[0]])
    assert any(f"checkpoint {newest} is unreadable or corrupt" in m for m in sagc_log)
    assert newest.is_dir()  # readers report, they do not move steps
    # A damaged step named explicitly is an error, one line, exit 1 (not accuracy 0, exit 0).
    # (Flipped values fail the checksum; flipped framing fails decoding: both are refused.)
    detected = r"(checksum mismatch|unreadable)"
    with pytest.raises(ckpt.CheckpointCorruptError, match=detected):
        load_policy(newest)
    assert main(["eval", "--checkpoint", str(newest), "--data", "arith_short", "--limit", "1",
                 "--num-samples", "0", "--no-progress"]) == 1
    assert re.search(detected, _one_line_error(capsys, str(newest)))
    assert main(["export", "--checkpoint", str(d), "--out", str(tmp_path / "hf")]) == 0
    model, _, _ = load_policy(tmp_path / "hf")
    _assert_same(_params(model), run["saved"][STEPS[0]])


def test_export_out_file_and_weights_mode(run, hf_dir, tmp_path, capsys):
    target = tmp_path / "model.bin"
    target.write_text("x")
    for force in ([], ["--force"]):
        assert main(["export", "--checkpoint", str(run["dir"]), "--out", str(target),
                     *force]) == 2
        _one_line_error(capsys, f"--out {target} is an existing file")
    umask = os.umask(0o022)
    os.umask(umask)
    assert (hf_dir / "model.safetensors").stat().st_mode & 0o777 == 0o666 & ~umask


def test_truncated_safetensors_is_one_line_naming_the_file(hf_dir, tmp_path, capsys):
    bad = tmp_path / "bad"
    shutil.copytree(hf_dir, bad)
    weights = bad / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    assert main(["eval", "--checkpoint", str(bad), "--data", "arith_short"]) == 2
    _one_line_error(capsys, f"{weights} (")
    assert main(["export", "--checkpoint", str(bad), "--out", str(tmp_path / "o")]) == 2
    _one_line_error(capsys, "truncated")


def test_run_tokenizer_comes_from_the_model_dir_or_must_fit_it(hf_dir, tmp_path):
    from sagc_jax.data.tokenizer import TokenizerError, load_run_tokenizer

    # model.tokenizer null: the model directory's own tokenizer.
    assert len(load_run_tokenizer(None, str(hf_dir))) == 101
    # No tokenizer files there and a vocabulary the built-in tokenizer does not fit: refused.
    bare = tmp_path / "bare"
    bare.mkdir()
    cfg = json.loads((hf_dir / "config.json").read_text())
    (bare / "config.json").write_text(json.dumps({**cfg, "vocab_size": 400}))
    with pytest.raises(TokenizerError, match=r"model.tokenizer is null.*101-token.*400"):
        load_run_tokenizer(None, str(bare))
    with pytest.raises(TokenizerError, match=r"model.tokenizer: .*101 tokens, more than "
                                             r"model.path .*vocab_size 64"):
        (bare / "config.json").write_text(json.dumps({**cfg, "vocab_size": 64}))
        load_run_tokenizer(str(hf_dir), str(bare))
    missing = tmp_path / "nope"
    with pytest.raises(TokenizerError, match=f"model.path: {missing} does not exist"):
        load_run_tokenizer(None, str(missing))
    with pytest.raises(TokenizerError, match=f"model.tokenizer: tokenizer directory {missing} "
                                             "does not exist"):
        load_run_tokenizer(str(missing), None)
    with pytest.raises(TokenizerError, match=f"model.tokenizer: no loadable tokenizer at {bare}"):
        load_run_tokenizer(str(bare), None)


# ------------------------------------------------------- exported tokenizer == training's encoding


def _training_ids(tok, prompts: list[str], chat: bool) -> list[list[int]]:
    """The prompt ids the training pipeline yields for `prompts`."""
    it = make_prompt_iterator([{"prompt": p} for p in prompts], tokenizer=tok, shuffle=False,
                              num_epochs=1, chat_template=chat)
    return [e["prompt_ids"].tolist() for e in it]


def _exported_ids(export_dir, prompts: list[str], chat: bool) -> list[list[int]]:
    """What a user gets from `AutoTokenizer.from_pretrained(export_dir)`."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(export_dir)
    if chat:
        return [list(tok.apply_chat_template([{"role": "user", "content": p}], tokenize=True,
                                             add_generation_prompt=True, return_dict=False))
                for p in prompts]
    return [list(tok(p).input_ids) for p in prompts]


HELD_OUT = [e["prompt"] for e in get_task("arith").eval_examples(20)]  # the main job's task


def test_exported_builtin_tokenizer_encodes_as_training(run, hf_dir):
    tok = load_tokenizer(None)
    prompts = [*HELD_OUT, "2+6+7+2=", ""]
    for chat in (False, True):
        want = _training_ids(tok, prompts, chat)
        assert _exported_ids(hf_dir, prompts, chat) == want
        assert all(ids.count(tok.bos_token_id) == 1 and ids[0] == tok.bos_token_id
                   for ids in want)
    assert tok.decode(want[20][1:]) == "user: 2+6+7+2=\nassistant: "
    # A prompt that spells out the bos itself gets no second one in training (a plain
    # transformers call on such text would add one: that is the tokenizer's documented rule).
    assert _training_ids(tok, ["<bos>1+2="], False) == [tok("1+2=").input_ids]


def _lively_run(root: pathlib.Path, lora: bool) -> pathlib.Path:
    """A run dir (the `run` fixture's model) whose greedy text depends on every prompt token,
    the bos included: the fresh init x 4 (the fixture's own params answer 's' * 16 to every
    prompt, which could not tell a missing bos). With `lora`, rank-4 adapters with non-zero B
    are the newest step, the base is `initial`: a LoRA run's layout."""
    from sagc_jax.models.lora import split_trainable

    cfg = config_from_dict({
        "run": {"dir": str(root), "seed": 3},
        "model": {"hidden_size": 32, "intermediate_size": 64, "num_layers": 2, "num_heads": 4,
                  "num_kv_heads": 2, **({"lora": {"rank": 4, "alpha": 8.0}} if lora else {})},
        "data": {"task": "arith"}, "checkpoint": {"async_save": False}})
    save_config(cfg, root / "config.yaml")
    tok = load_tokenizer(None)
    model, mcfg = build_model(cfg, len(tok), tok, None)
    _, params = nnx.split(model)
    params = jax.tree.map(lambda x: x * 4.0, params)
    saver = ckpt.RunCheckpointer(root / "checkpoints", every=1, keep=2, async_save=False)
    saver.save_initial(params, mcfg)
    if lora:
        adapters, _ = split_trainable(params)
        keys = iter(jax.random.split(jax.random.key(7), 64))
        adapters = jax.tree.map(lambda x: jax.random.normal(next(keys), x.shape) * 0.3, adapters)
        data_iter = make_prompt_iterator([{"prompt": "1+1=", "answer": "2"}], tokenizer=tok)
        saver.save(1, ckpt.Snapshot(1, adapters, optax.adam(1e-3).init(adapters),
                                    {"x": np.zeros(2)}, data_iter), force=True)
        saver.wait()
    return root


def _greedy(model, tok, examples) -> list[str]:
    """`sagc-jax eval`'s greedy completions (our sampler)."""
    r = evaluate(model, tok, examples, reward_fns=[RewardFn.from_name("exact_answer")],
                 num_samples=0, max_new_tokens=NEW, batch_prompts=10, decode_chunk=CHUNK,
                 details=True)
    return [p["greedy"] for p in r["per_prompt"]]


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_pipeline_greedy_equals_our_sampler(lora, tmp_path):
    """`pipeline("text-generation", model=export)` exactly as a user runs it == `sagc-jax
    eval`'s greedy completions on the main job's held-out prompts; for a LoRA run also the PEFT
    export loaded onto its base with `peft`. The bos comes from the exported files alone."""
    from hf_fixtures import load_hf, pipeline_greedy
    from transformers import AutoTokenizer

    run_dir = _lively_run(tmp_path / "run", lora)
    model, tok, _ = load_policy(run_dir)
    examples = get_task("arith").eval_examples(len(HELD_OUT))
    ours = _greedy(model, tok, examples)
    assert len(ours) >= 20 and len(set(ours)) > 10
    if not lora:  # without the bos this model says something else: a lost bos would show
        no_bos = [{**e, "prompt_ids": tok(e["prompt"], add_special_tokens=False).input_ids}
                  for e in examples]
        assert sum(a != b for a, b in zip(ours, _greedy(model, tok, no_bos))) > 10
    assert pipeline_greedy(str(export(run_dir, tmp_path / "hf")), HELD_OUT, NEW) == ours
    if lora:
        peft = pytest.importorskip("peft")
        assert _greedy(load_policy(run_dir / "checkpoints" / "initial")[0], tok,
                       examples) != ours  # the adapters matter
        base = export(run_dir / "checkpoints" / "initial", tmp_path / "base")  # B = 0: the base
        adapter = export(run_dir, tmp_path / "peft", fmt="peft")
        on_base = peft.PeftModel.from_pretrained(load_hf(base), adapter).eval()
        got = pipeline_greedy(on_base, HELD_OUT, NEW, tokenizer=AutoTokenizer.from_pretrained(
            adapter))
        assert got == ours


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_exported_hf_tokenizer_encodes_as_training(kind, tiny_hf_dir, tmp_path):  # noqa: F811
    """A run on an HF model with its own tokenizer (Llama: bos `<s>`, whose chat template
    emits it too; Qwen2: no bos) and `data.chat_template`, LoRA adapters on: the merged and the
    PEFT export's tokenizers encode plain and chat prompts as training did, bos exactly once or
    never."""
    from hf_fixtures import build_hf_tokenizer

    from sagc_jax.data.tokenizer import load_run_tokenizer

    model_dir = tmp_path / "base"
    shutil.copytree(tiny_hf_dir(kind), model_dir)
    build_hf_tokenizer(kind).save_pretrained(model_dir)
    cfg = config_from_dict({
        "run": {"dir": str(tmp_path / "run")}, "model": {"path": str(model_dir),
                                                        "lora": {"rank": 2}},
        "data": {"task": "arith", "chat_template": True}, "checkpoint": {"async_save": False}})
    save_config(cfg, tmp_path / "run" / "config.yaml")
    tok = load_run_tokenizer(cfg.model.tokenizer, cfg.model.path)  # what the trainer calls
    model, mcfg = build_model(cfg, len(tok), tok, None)
    ckpt.RunCheckpointer(tmp_path / "run" / "checkpoints", every=1, keep=1,
                         async_save=False).save_initial(nnx.split(model)[1], mcfg)
    prompts = [*HELD_OUT[:5], "Hello, World!"]
    for fmt in ("merged", "peft"):
        out = export(tmp_path / "run", tmp_path / fmt, fmt=fmt)
        for chat in (False, True):
            want = _training_ids(tok, prompts, chat)
            assert _exported_ids(out, prompts, chat) == want, (fmt, chat)
            if kind == "llama":  # `<s>` = 1: first, and only once (the template emits it too)
                assert all(ids[0] == 1 and ids.count(1) == 1 for ids in want), (fmt, chat)
            else:
                assert tok.bos_token_id is None and all(ids[0] != 0 for ids in want)
                if not chat:
                    assert want == [tok(p, add_special_tokens=False).input_ids for p in prompts]
