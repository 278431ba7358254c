"""Tests for sagc_jax.config: defaults, YAML + overrides, one-line errors, round trip."""

from __future__ import annotations

import pathlib

import pytest

from sagc_jax.config import (
    Config,
    ConfigError,
    RewardSpec,
    apply_overrides,
    config_from_dict,
    config_keys,
    config_to_dict,
    load_config,
    save_config,
)

REPO = pathlib.Path(__file__).resolve().parent.parent
TINY = REPO / "configs" / "tiny_cpu.yaml"


def _err(overrides: list[str], path: str | None = None) -> str:
    """The ConfigError message for loading ``path`` with ``overrides``; checks it is one line."""
    with pytest.raises(ConfigError) as exc:
        load_config(path, overrides)
    msg = str(exc.value)
    assert "\n" not in msg
    assert isinstance(exc.value, ValueError)
    return msg


def test_defaults_validate() -> None:
    cfg = load_config(None, [])
    assert cfg == Config()
    assert cfg.validate() is cfg
    assert cfg.run.steps == 200 and cfg.run.resume == "auto"
    assert cfg.sagc.group_sizes == (4, 8, 12, 16) and cfg.sagc.initial_group_size is None
    assert cfg.sagc.start_group_size == 16  # null: the largest rung, also after an override
    assert load_config(None, ["sagc.group_sizes=[4,8]"]).sagc.start_group_size == 8
    assert cfg.sampling.prompt_buckets == (32, 64, 128)
    assert cfg.rewards == (RewardSpec("exact_answer", 1.0),)
    assert cfg.reward_on_error == "raise"
    assert cfg.mesh.data == -1
    assert config_from_dict({}) == cfg


def test_sagc_defaults_match_contract() -> None:
    s = Config().sagc
    assert s.enabled is True
    # issue 49: no straggler budget by default (benefit per second); tail_share is the cost
    # reported, and the one a stated delta bounds.
    assert s.straggler == "tail_share" and s.delta is None
    assert s.batch_policy == "prompts" and s.rollouts_per_step is None


def test_yaml_and_overrides(tmp_path: pathlib.Path) -> None:
    p = tmp_path / "c.yaml"
    p.write_text(
        "run: {steps: 7, dir: out}\n"
        "sagc:\n  group_sizes: [2, 4]\n  initial_group_size: 2\n"
        "optim:\n  lr: 1e-4\n"  # no dot: still a float
        "rewards:\n  - {name: exact_answer, weight: 0.5}\n  - {name: fmt}\n"
    )
    cfg = load_config(
        str(p),
        [
            "sagc.group_sizes=[4,8]",
            "sagc.initial_group_size=4",
            "optim.lr=3e-5",
            "optim.warmup_steps=3",
            "rewards[1].weight=2",
            "model.head_dim=null",
            "algo.beta=1",  # int accepted for float
            "sampling={top_p: 0.9}",  # mapping merges into the section
        ],
    )
    assert cfg.run.steps == 7 and cfg.run.dir == "out"
    assert cfg.sagc.group_sizes == (4, 8)
    assert isinstance(cfg.sagc.group_sizes, tuple)
    assert cfg.sagc.initial_group_size == 4
    assert cfg.optim.lr == pytest.approx(3e-5) and isinstance(cfg.optim.lr, float)
    assert cfg.optim.warmup_steps == 3
    assert cfg.rewards == (RewardSpec("exact_answer", 0.5), RewardSpec("fmt", 2.0))
    assert cfg.algo.beta == 1.0 and isinstance(cfg.algo.beta, float)
    assert cfg.sampling.top_p == pytest.approx(0.9)
    assert cfg.sampling.prompt_buckets == (32, 64, 128)  # untouched by the merge
    # Untouched sections keep defaults.
    assert cfg.model == Config().model


def test_train_file_with_null_task() -> None:
    cfg = load_config(None, ["data.task=null", "data.train_file=train.jsonl"])
    assert cfg.data.task is None and cfg.data.train_file == "train.jsonl"


def test_null_override_replaces_a_section(tmp_path: pathlib.Path) -> None:
    """`model.lora=null` on the command line turns off the file's LoRA (full fine-tuning); a
    file's empty section header (`lora:` with nothing under it) keeps the default section."""
    p = tmp_path / "c.yaml"
    p.write_text("model:\n  lora: {rank: 4, alpha: 8.0}\nsampling:\n")
    assert load_config(str(p)).model.lora.rank == 4
    assert load_config(str(p), ["model.lora=null"]).model.lora is None
    assert load_config(str(p)).sampling == Config().sampling


def test_apply_overrides_does_not_mutate() -> None:
    base = {"sagc": {"delta": 0.1}}
    out = apply_overrides(base, ["sagc.delta=0.2", "rewards[0]={name: x}"])
    assert base == {"sagc": {"delta": 0.1}}
    assert out["sagc"]["delta"] == 0.2 and out["rewards"] == [{"name": "x"}]


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        # unknown key, with a suggestion
        (["sagc.detla=0.5"], "unknown key 'sagc.detla' (did you mean 'sagc.delta'?)"),
        (["sagcc.delta=0.5"], "unknown key 'sagcc.delta' (did you mean 'sagc.delta'?)"),
        (
            ["optim.warmup_step=3"],
            "unknown key 'optim.warmup_step' (did you mean 'optim.warmup_steps'?)",
        ),
        (
            ["rewards[0].wieght=1"],
            "unknown key 'rewards[0].wieght' (did you mean 'rewards[0].weight'?)",
        ),
        # wrong type
        (["optim.lr=abc"], "optim.lr: expected float, got 'abc'"),
        (["run.steps=1.5"], "run.steps: expected int, got 1.5"),
        (["run.steps=null"], "run.steps: expected int, got None"),
        (["run.progress=1"], "run.progress: expected bool, got 1"),
        (["run.progress=maybe"], "run.progress: expected bool, got 'maybe'"),
        (["model.head_dim=abc"], "model.head_dim: expected int or None, got 'abc'"),
        (["sagc.group_sizes=4"], "sagc.group_sizes: expected list of int, got 4"),
        (["sagc.group_sizes=[4, x]"], "sagc.group_sizes[1]: expected int, got 'x'"),
        (["run=3"], "run: expected mapping, got 3"),
        # out of range
        (["sagc.delta=1.5"], "sagc.delta: must be in (0, 1), got 1.5"),
        (["optim.lr=0"], "optim.lr: must be > 0, got 0.0"),
        (["run.steps=0"], "run.steps: must be >= 1, got 0"),
        (["sampling.top_p=1.5"], "sampling.top_p: must be in (0, 1], got 1.5"),
        (["mesh.data=0"], "mesh.data: must be -1 or >= 1, got 0"),
        (["sampling.prompt_buckets=[0, 8]"], "sampling.prompt_buckets[0]: must be >= 1, got 0"),
        # bad choice
        (
            ["run.resume=sometimes"],
            "run.resume: must be one of 'auto', 'never', 'required', got 'sometimes'",
        ),
        (
            ["algo.loss_agg=sum"],
            "algo.loss_agg: must be one of 'token-mean', "
            "'seq-mean-token-mean', 'seq-mean-token-sum-norm', got 'sum'",
        ),
        (
            ["reward_on_error=ignore"],
            "reward_on_error: must be one of 'raise', 'zero', got 'ignore'",
        ),
        # cross-field
        (
            ["sagc.initial_group_size=5"],
            "sagc.initial_group_size: must be one of sagc.group_sizes [4, 8, 12, 16], got 5",
        ),
        (["algo.epsilon_high=0.1"], "algo.epsilon_high: must be >= algo.epsilon (0.2), got 0.1"),
        (
            ["sampling.prompt_buckets=[64, 32]"],
            "sampling.prompt_buckets: must be strictly increasing, got [64, 32]",
        ),
        (
            ["sagc.group_sizes=[8, 4]", "sagc.initial_group_size=4"],
            "sagc.group_sizes: must be strictly increasing, got [8, 4]",
        ),
        (["data.task=null"], "data.task: exactly one of data.task and data.train_file must be set"),
        (
            ["data.train_file=x.jsonl"],
            "data.train_file: set data.task=null when using a train "
            "file (got task='arith', train_file='x.jsonl')",
        ),
        (["model.num_kv_heads=3"], "model.num_kv_heads: must divide model.num_heads (4), got 3"),
        (["rewards=[]"], "rewards: must list at least one reward"),
        # list of dataclasses: index in the key
        (
            ["rewards=[{name: a}, {name: b, weight: x}]"],
            "rewards[1].weight: expected float, got 'x'",
        ),
        (["rewards[1]={weight: 2}"], "rewards[1].name: required"),
        # malformed overrides
        (["sagc.delta"], "bad override 'sagc.delta': expected key=value"),
        (
            ["rewards[5].weight=1"],
            "rewards[5].weight: index 5 out of range (list has 1 items; use index 1 to append)",
        ),
    ],
)
def test_error_messages(overrides: list[str], expected: str) -> None:
    assert _err(overrides) == expected


def test_yaml_errors(tmp_path: pathlib.Path) -> None:
    assert _err([], str(tmp_path / "nope.yaml")) == (
        f"config file not found: {str(tmp_path / 'nope.yaml')!r}"
    )
    bad = tmp_path / "bad.yaml"
    bad.write_text("run: [unclosed\n")
    assert _err([], str(bad)).startswith(f"{bad}: invalid YAML")
    lst = tmp_path / "list.yaml"
    lst.write_text("- 1\n- 2\n")
    assert _err([], str(lst)) == f"{lst}: expected a mapping at the top level, got list"
    typo = tmp_path / "typo.yaml"
    typo.write_text("sagc:\n  delta: 0.2\n  warmup_step: 3\n")
    assert _err([], str(typo)) == (
        "unknown key 'sagc.warmup_step' (did you mean 'sagc.warmup_steps'?)"
    )


def test_empty_yaml_and_null_section(tmp_path: pathlib.Path) -> None:
    p = tmp_path / "empty.yaml"
    p.write_text("")
    assert load_config(str(p), []) == Config()
    p.write_text("sagc:\nrun:\n  steps: 3\n")
    cfg = load_config(str(p), [])
    assert cfg.sagc == Config().sagc and cfg.run.steps == 3


def test_validate_after_replace() -> None:
    cfg = Config()
    bad = cfg.model_copy(update={"optim": cfg.optim.model_copy(update={"lr": -1.0})})
    with pytest.raises(ConfigError, match=r"^optim\.lr: must be > 0, got -1\.0$"):
        bad.validate()
    bad = cfg.model_copy(update={"algo": cfg.algo.model_copy(update={"epsilon_high": 0.1})})
    with pytest.raises(ConfigError, match=r"^algo\.epsilon_high: must be >="):
        bad.validate()


def test_round_trip(tmp_path: pathlib.Path) -> None:
    cfg = load_config(
        str(TINY),
        [
            "rewards=[{name: exact_answer, weight: 0.5}, {name: fmt, weight: 0.25}]",
            "optim.lr=3e-5",
            "sampling.cache_buckets=[160, 256]",
            "model.head_dim=32",
        ],
    )
    out = tmp_path / "sub" / "config.yaml"
    save_config(cfg, out)
    assert load_config(str(out), []) == cfg
    assert config_from_dict(config_to_dict(cfg)) == cfg
    d = config_to_dict(Config())
    assert d["sagc"]["group_sizes"] == [4, 8, 12, 16]
    assert d["rewards"] == [{"name": "exact_answer", "weight": 1.0}]


def test_tiny_cpu_yaml_loads() -> None:
    """The README's main job: a fresh tiny Llama on the built-in task, SAGC on, SFT warm start,
    deterministic SAGC timing (so runs resume exactly)."""
    cfg = load_config(str(TINY), [])
    assert cfg.data.task == "arith" and cfg.model.path is None
    assert cfg.model.model_type == "llama" and cfg.model.hidden_size <= 256
    assert cfg.init.sft_steps > 0 and cfg.run.steps > 0
    assert cfg.sagc.enabled and cfg.sagc.group_sizes == (4, 8, 12, 16)
    assert cfg.sagc.timing == "model"
    assert cfg.validate() is cfg


def test_config_keys() -> None:
    keys = config_keys()
    assert "sagc.delta" in keys and "rewards[*].weight" in keys and "reward_on_error" in keys
    assert "run.steps" in keys and "run" not in keys
    assert "sagc" in config_keys(sections=True)


def test_mesh_shape() -> None:
    mesh = Config().mesh
    assert mesh.shape(4) == (4, 1, 1)
    fsdp2 = mesh.model_copy(update={"fsdp": 2})
    assert fsdp2.shape(4) == (2, 2, 1)
    with pytest.raises(ConfigError, match="must divide"):
        fsdp2.shape(3)
    with pytest.raises(ConfigError, match="must equal"):
        mesh.model_copy(update={"data": 2}).shape(4)


def test_sections_built_directly_raise_one_line_errors() -> None:
    """Every section is checked on construction too, naming its own dotted key."""
    from sagc_jax.config import OptimConfig, SAGCConfig

    assert OptimConfig(lr=1) == OptimConfig(lr=1.0)
    for build, msg in [
        (lambda: OptimConfig(lr=0), "optim.lr: must be > 0, got 0.0"),
        (lambda: OptimConfig(lrr=1e-3), "unknown key 'optim.lrr' (did you mean 'optim.lr'?)"),
        (lambda: RewardSpec(weight=2.0), "rewards[*].name: required"),
        (lambda: RewardSpec(" "), "rewards[*].name: must be a non-empty string"),
        (lambda: SAGCConfig(tau=0.5), "sagc.tau: must be >= 1, got 0.5"),
        (lambda: SAGCConfig(V=float("nan")), "sagc.V: must be a finite number, got nan"),
    ]:
        with pytest.raises(ConfigError) as exc:
            build()
        assert str(exc.value) == msg


def test_sections_are_frozen_and_hashable() -> None:
    cfg = Config()
    with pytest.raises(ValueError):
        cfg.run.steps = 3  # type: ignore[misc]
    assert hash(cfg) == hash(Config()) and len({cfg, Config(), cfg.model_copy()}) == 1
    assert hash(cfg.sagc) != hash(cfg.sagc.model_copy(update={"delta": 0.2}))


def test_sagc_section_declared_once() -> None:
    """The trainer's ``sagc:`` section and the simulator's are the controller's own class, with
    its defaults (docs/sagc.md), and a bad sagc key is named the same way by both."""
    from sagc_jax.sagc import SAGCConfig
    from sagc_jax.sagc.controller import SAGCConfig as ControllerSAGC
    from sagc_jax.sagc.simulate import parse_sim_config

    sim = parse_sim_config({"seed": 0})
    assert type(Config().sagc) is SAGCConfig is ControllerSAGC
    # The same defaults; each passes its own run length as the horizon (and the simulator its
    # seed) when it builds the controller.
    assert sim.sagc == Config().sagc == SAGCConfig()
    s = SAGCConfig()
    assert (s.half_life, s.risk, s.warmup_steps, s.tau) == (100.0, "q90", 4, 2.0)
    from sagc_jax.sagc.simulate import sagc_policy

    dec = sagc_policy(parse_sim_config({"seed": 7, "steps": 30})).state.decision
    assert (int(dec.seed), int(dec.horizon)) == (7, 30)  # the simulator's seed seeds SAGC
    for bad, msg in [
        ({"detla": 0.5}, "unknown key 'sagc.detla' (did you mean 'sagc.delta'?)"),
        ({"tau": 0.5}, "sagc.tau: must be >= 1, got 0.5"),
        ({"half_life": "x"}, "sagc.half_life: expected float, got 'x'"),
    ]:
        with pytest.raises(ConfigError) as exc:
            config_from_dict({"sagc": bad})
        assert str(exc.value) == msg
        with pytest.raises(ConfigError) as exc:
            parse_sim_config({"sagc": bad})
        assert str(exc.value) == msg


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (
            ["algo.importance_sampling=seq"],
            "algo.importance_sampling: must be one of 'token', 'sequence', got 'seq'",
        ),
        (
            ["algo.scale_rewards=std"],
            "algo.scale_rewards: must be one of 'group', 'batch', 'none', got 'std'",
        ),
        (["algo.std_ddof=2"], "algo.std_ddof: must be in [0, 1], got 2"),
        (["algo.std_ddof=true"], "algo.std_ddof: expected int, got True"),
        (["algo.kl_bias_correction=1"], "algo.kl_bias_correction: expected bool, got 1"),
        (["algo.clip_delta=0.5"], "algo.clip_delta: must be > 1, got 0.5"),
        (
            ["algo.clip_delta=1.2"],
            "algo.clip_delta: must be > 1 + algo.epsilon_high (1.28), got 1.2",
        ),
        (
            ["algo.top_entropy_quantile=1.5"],
            "algo.top_entropy_quantile: must be in [0, 1], got 1.5",
        ),
        (["algo.advantage=dr_grpo"], "unknown key 'algo.advantage'"),
    ],
)
def test_algo_option_errors(overrides: list[str], expected: str) -> None:
    assert _err(overrides).startswith(expected)


def test_algo_options_load() -> None:
    cfg = load_config(None, ["algo.importance_sampling=sequence", "algo.scale_rewards=none",
                             "algo.std_ddof=1", "algo.kl_bias_correction=true",
                             "algo.clip_delta=3", "algo.top_entropy_quantile=0.2"])
    a = cfg.algo
    assert (a.importance_sampling, a.scale_rewards, a.std_ddof) == ("sequence", "none", 1)
    assert a.kl_bias_correction is True and a.clip_delta == 3.0 and a.top_entropy_quantile == 0.2
    default = load_config(None, []).algo
    assert default.adv_eps == 1e-4 and default.clip_delta is None and default.std_ddof == 0


def test_sagc_horizon_is_the_run_length() -> None:
    from sagc_jax.train.setup import _make_policy

    pol = _make_policy(load_config(None, ["run.steps=77"]))
    assert int(pol.state.decision.horizon) == 77 and int(pol.state.decision.seed) == 0
    # No longer a key: one line saying who passes it now.
    with pytest.raises(ConfigError, match=r"^sagc\.horizon: removed .*passed by the trainer"):
        load_config(None, ["sagc.horizon=500"])


def test_matmul_dtype_reaches_the_model() -> None:
    """`model.matmul_dtype` is the architecture's (so every forward's: train step, sampler,
    evals); a bad value is a one-line error naming the field."""
    from sagc_jax.models.build import model_config

    assert model_config(load_config(TINY), 512).matmul_dtype is None
    assert model_config(load_config(TINY, ["model.matmul_dtype=bfloat16"]), 512).matmul_dtype \
        == "bfloat16"
    assert _err(["model.matmul_dtype=float16"]).startswith("model.matmul_dtype: ")
