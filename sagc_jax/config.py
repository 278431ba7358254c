"""Configuration: frozen dataclasses, YAML loading, ``key=value`` overrides, validation.

All validation lives here. Every problem is reported as a :class:`ConfigError` whose message is
one line naming the dotted key and what is allowed, e.g.::

    sagc.delta: must be in (0, 1), got 1.5
    unknown key 'sagc.detla' (did you mean 'sagc.delta'?)
    optim.lr: expected float, got 'abc'

Usage::

    cfg = load_config("configs/tiny_cpu.yaml", ["sagc.group_sizes=[4,8]", "optim.lr=3e-5"])

Validation is generic: :func:`config_from_dict` walks the dataclass type hints (nested sections,
``X | None``, ``Literal[...]``, ``tuple[X, ...]`` including tuples of dataclasses) and applies the
declarative per-field rules kept in ``field(metadata=...)`` (``"range"``, ``"choices"``,
``"allow"``). Cross-field rules live in :meth:`Config.validate`. Sections that define their own
``validate()`` (e.g. ``SAGCConfig``) have it called, with ``ValueError`` turned into
``ConfigError``.

YAML values (from files and overrides) are parsed with a ``yaml.SafeLoader`` subclass that also
reads exponent floats without a dot (``3e-5``) as floats, as YAML 1.2 does; PyYAML alone would
read them as strings.
"""

from __future__ import annotations

import dataclasses
import difflib
import itertools
import os
import re
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import yaml

__all__ = [
    "AlgoConfig",
    "CheckpointConfig",
    "Config",
    "ConfigError",
    "DataConfig",
    "DistributedConfig",
    "InitConfig",
    "MeshConfig",
    "ModelConfig",
    "OptimConfig",
    "Range",
    "RewardSpec",
    "RunConfig",
    "SAGCConfig",
    "SamplingConfig",
    "apply_overrides",
    "config_from_dict",
    "config_keys",
    "config_to_dict",
    "load_config",
    "save_config",
]


class ConfigError(ValueError):
    """A configuration problem; the message is one line naming the offending key."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(str(message).splitlines()))


# --------------------------------------------------------------------------------------------
# Declarative field rules
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Range:
    """Allowed numeric interval; ``None`` bounds are unbounded. ``*_open`` excludes the bound."""

    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False

    def contains(self, v: float) -> bool:
        """Whether ``v`` lies in the interval (NaN never does)."""
        if v != v:  # NaN
            return False
        if self.lo is not None and not (v > self.lo if self.lo_open else v >= self.lo):
            return False
        return self.hi is None or (v < self.hi if self.hi_open else v <= self.hi)

    def describe(self) -> str:
        """Human text, e.g. ``in (0, 1)``, ``>= 1``, ``> 0``."""
        if self.lo is not None and self.hi is not None:
            return (
                f"in {'(' if self.lo_open else '['}{self.lo}, {self.hi}"
                f"{')' if self.hi_open else ']'}"
            )
        if self.lo is not None:
            return f"{'>' if self.lo_open else '>='} {self.lo}"
        if self.hi is not None:
            return f"{'<' if self.hi_open else '<='} {self.hi}"
        return "any number"


def _rules(
    doc: str,
    *,
    gt: float | None = None,
    ge: float | None = None,
    lt: float | None = None,
    le: float | None = None,
    choices: tuple[Any, ...] | None = None,
    allow: tuple[Any, ...] = (),
) -> dict[str, Any]:
    """Build field metadata: a doc string plus optional range / choices / allowed extras.

    For tuple-valued fields the range and choices apply to every element.
    ``allow`` lists special values accepted regardless of the range (e.g. ``-1``).
    """
    meta: dict[str, Any] = {"doc": doc}
    if gt is not None or ge is not None or lt is not None or le is not None:
        meta["range"] = Range(
            lo=gt if gt is not None else ge,
            hi=lt if lt is not None else le,
            lo_open=gt is not None,
            hi_open=lt is not None,
        )
    if choices is not None:
        meta["choices"] = tuple(choices)
    if allow:
        meta["allow"] = tuple(allow)
    return meta


def _f(default: Any, doc: str, **rules: Any) -> Any:
    """A dataclass field with a default, a doc string and declarative validation rules."""
    return field(default=default, metadata=_rules(doc, **rules))


# --------------------------------------------------------------------------------------------
# Sections
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunConfig:
    """Run bookkeeping: output directory, length, logging, resuming."""

    dir: str = _f("runs/tiny", "Output directory (config.yaml, metrics.jsonl, checkpoints).")
    steps: int = _f(200, "Number of GRPO training steps.", ge=1)
    seed: int = _f(0, "Global seed (params init, data order, sampling keys).")
    resume: Literal["auto", "never", "required"] = _f(
        "auto",
        "auto: resume if a checkpoint exists in run.dir; never: start fresh; "
        "required: fail without a checkpoint.",
    )
    log_every: int = _f(1, "Print/log a metrics line every N steps.", ge=1)
    progress: bool = _f(True, "Show progress bars (compile warm-up, training).")
    eval_every: int = _f(0, "Evaluate every N steps; 0 = off.", ge=0)
    plots: bool = _f(True, "Write PNG plots of the run.")


@dataclass(frozen=True)
class ModelConfig:
    """Policy model. With ``path`` set the architecture comes from the HF config there."""

    path: str | None = _f(
        None, "HF model directory (config.json + safetensors); None = fresh random model."
    )
    tokenizer: str | None = _f(
        None, "HF tokenizer directory; None = built-in tokenizer shipped with the package."
    )
    model_type: Literal["llama", "qwen2"] = _f("llama", "Model family (fresh models only).")
    hidden_size: int = _f(128, "Residual width.", ge=1)
    intermediate_size: int = _f(384, "SwiGLU MLP width.", ge=1)
    num_layers: int = _f(4, "Number of transformer blocks.", ge=1)
    num_heads: int = _f(4, "Query heads.", ge=1)
    num_kv_heads: int = _f(2, "Key/value heads (GQA); must divide num_heads.", ge=1)
    head_dim: int | None = _f(None, "Per-head width; None = hidden_size // num_heads.", ge=1)
    rope_theta: float = _f(10000.0, "RoPE base frequency.", gt=0)
    max_position_embeddings: int = _f(512, "Maximum sequence length (prompt + completion).", ge=1)
    tie_word_embeddings: bool = _f(True, "Share input embedding and LM head.")
    attention_bias: bool = _f(False, "Bias on q/k/v projections (Qwen2 style).")
    dtype: Literal["float32", "bfloat16"] = _f(
        "float32", "Compute/param dtype for the policy and sampler."
    )
    remat: bool = _f(False, "Rematerialise transformer blocks in the backward pass.")


@dataclass(frozen=True)
class DataConfig:
    """Prompt source: a built-in task or a JSONL/Parquet file."""

    task: str | None = _f("arith", "Built-in task name; set to null when train_file is given.")
    train_file: str | None = _f(None, "JSONL or Parquet training prompts.")
    eval_file: str | None = _f(None, "JSONL or Parquet evaluation prompts.")
    prompt_column: str = _f("prompt", "Column holding the prompt text.")
    answer_column: str = _f("answer", "Column holding the reference answer.")
    prompts_per_step: int = _f(8, "Distinct prompts per step (each gets G rollouts).", ge=1)
    shuffle: bool = _f(True, "Shuffle prompts each epoch.")
    num_epochs: int | None = _f(None, "Passes over the data; None = repeat forever.", ge=1)
    chat_template: bool = _f(False, "Wrap prompts with the tokenizer's chat template.")
    num_eval: int = _f(200, "Held-out examples generated for a built-in task.", ge=0)
    task_min_steps: int = _f(1, "Built-in task: minimum reasoning steps per problem.", ge=1)
    task_max_steps: int = _f(12, "Built-in task: maximum reasoning steps per problem.", ge=1)
    worker_count: int = _f(0, "grain worker processes; 0 = in-process.", ge=0)
    shards: int | None = _f(
        None,
        "Virtual data shards (a multiple of the process count; prompts_per_step must divide by "
        "it); None = one per process. Fixing it makes the prompt order independent of how many "
        "processes run.",
        ge=1,
    )


@dataclass(frozen=True)
class SamplingConfig:
    """Rollout generation and its compiled shape set."""

    max_new_tokens: int = _f(128, "Maximum completion tokens per row.", ge=1)
    temperature: float = _f(1.0, "Sampling temperature.", gt=0)
    top_k: int | None = _f(None, "Keep the k most likely tokens; None = off.", ge=1)
    top_p: float | None = _f(None, "Nucleus sampling mass; None = off.", gt=0, le=1)
    prompt_buckets: tuple[int, ...] = _f(
        (32, 64, 128),
        "Prompt lengths (tokens) prompts are padded up to; strictly increasing.",
        ge=1,
    )
    cache_buckets: tuple[int, ...] | None = _f(
        None, "KV-cache lengths; None = derived from prompt_buckets + max_new_tokens.", ge=1
    )
    decode_chunk: int = _f(16, "Decode tokens per chunk inside the while loop.", ge=1)
    prompt_too_long: Literal["error", "truncate"] = _f(
        "error", "What to do with a prompt longer than the largest bucket."
    )


try:  # The real controller config; a stand-in with the same fields until it exists.
    from sagc_jax.sagc.controller import SAGCConfig
except ImportError:  # pragma: no cover - exercised only before controller.py lands

    @dataclass(frozen=True)
    class SAGCConfig:  # type: ignore[no-redef]
        """Stand-in for ``sagc_jax.sagc.controller.SAGCConfig`` (same fields and defaults)."""

        enabled: bool = _f(True, "Adapt G; False = fixed initial_group_size.")
        group_sizes: tuple[int, ...] = _f((4, 8, 12, 16), "Allowed group sizes (the rungs).")
        initial_group_size: int = _f(8, "G at step 0; one of group_sizes.")
        tau: float = _f(2.0, "Straggler threshold multiplier on the typical length.")
        count_truncated: bool = _f(True, "Count truncated rollouts as straggler events.")
        delta: float = _f(0.1, "Target straggler risk.")
        V: float = _f(1.0, "Drift-plus-penalty trade-off weight.")
        half_life: float = _f(50.0, "Half-life (steps) of the observation weighting.")
        risk: str = _f("mean", "Risk aggregation.")
        max_rung_step: int = _f(1, "Max rungs G may move per step.")
        warmup_steps: int = _f(5, "Steps at initial_group_size before adapting.")
        batch_policy: Literal["prompts", "rollouts"] = _f(
            "prompts", "Hold prompts fixed (rows = P*G) or rollouts fixed (P = R/G)."
        )
        rollouts_per_step: int | None = _f(None, "Rows per step when batch_policy=rollouts.")
        seed: int = _f(0, "Seed for the controller's bootstrap sampling.")


# Rules for fields of sections we do not own (applied when the field has no rules of its own).
_EXTRA_RULES: dict[str, dict[str, Any]] = {
    "sagc.group_sizes": _rules("", ge=1),
    "sagc.initial_group_size": _rules("", ge=1),
    "sagc.tau": _rules("", gt=0),
    "sagc.delta": _rules("", gt=0, lt=1),
    "sagc.V": _rules("", ge=0),
    "sagc.half_life": _rules("", gt=0),
    "sagc.max_rung_step": _rules("", ge=0),
    "sagc.timing": _rules("", choices=("measured", "model")),
    "sagc.warmup_steps": _rules("", ge=0),
    "sagc.batch_policy": _rules("", choices=("prompts", "rollouts")),
    "sagc.rollouts_per_step": _rules("", ge=1),
}


@dataclass(frozen=True)
class AlgoConfig:
    """GRPO / DAPO / Dr. GRPO objective."""

    beta: float = _f(0.0, "KL weight; 0 = no reference model.", ge=0)
    kl_estimator: Literal["k1", "k3"] = _f("k3", "KL estimator (Schulman's k1 or k3).")
    epsilon: float = _f(0.2, "Lower PPO clip range (ratio >= 1 - epsilon).", gt=0, lt=1)
    epsilon_high: float = _f(
        0.28, "Upper clip range (ratio <= 1 + epsilon_high); DAPO clip-higher.", gt=0
    )
    loss_agg: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"] = _f(
        "token-mean", "How per-token losses are aggregated."
    )
    num_iterations: int = _f(1, "Optimisation passes (mu) per batch of rollouts.", ge=1)
    advantage: Literal["grpo", "dr_grpo"] = _f(
        "grpo", "grpo: (r - mean) / (std + eps); dr_grpo: r - mean."
    )
    adv_eps: float = _f(1e-6, "Epsilon added to the group std.", gt=0)
    micro_batch_rows: int | None = _f(
        None, "Rows per gradient-accumulation micro-batch; None = whole batch.", ge=1
    )
    dynamic_sampling: bool = _f(False, "DAPO: drop groups whose rewards are all equal.")
    dynamic_sampling_rounds: int = _f(
        0, "Extra sampling rounds to refill dropped groups (0 = none).", ge=0
    )
    overlong_buffer: int = _f(
        0, "DAPO soft overlong punishment window (tokens before the limit); 0 = off.", ge=0
    )
    overlong_penalty: float = _f(1.0, "Maximum overlong penalty (reached at the limit).", ge=0)
    mask_truncated: bool = _f(False, "Exclude truncated completions from the loss.")


@dataclass(frozen=True)
class OptimConfig:
    """AdamW with warm-up and cosine/constant schedule."""

    lr: float = _f(1e-4, "Peak learning rate.", gt=0)
    warmup_steps: int = _f(10, "Linear warm-up steps.", ge=0)
    schedule: Literal["cosine", "constant"] = _f("cosine", "Decay after warm-up.")
    min_lr_ratio: float = _f(0.1, "Final lr as a fraction of peak (cosine).", ge=0, le=1)
    weight_decay: float = _f(0.0, "Decoupled weight decay.", ge=0)
    b1: float = _f(0.9, "Adam beta1.", ge=0, lt=1)
    b2: float = _f(0.99, "Adam beta2.", ge=0, lt=1)
    eps: float = _f(1e-8, "Adam epsilon.", gt=0)
    max_grad_norm: float = _f(1.0, "Global-norm gradient clipping; 0 = off.", ge=0)


@dataclass(frozen=True)
class InitConfig:
    """Optional supervised warm start before RL (built-in tasks)."""

    sft_steps: int = _f(0, "SFT steps before GRPO; 0 = none.", ge=0)
    sft_lr: float = _f(1e-3, "SFT learning rate.", gt=0)
    sft_batch_size: int = _f(32, "SFT examples per step.", ge=1)
    sft_format_noise: float = _f(
        0.0, "Fraction of SFT solutions whose answer line is written 'answer: N' instead of "
        "'#### N' (which the exact_answer reward needs): GRPO then has a format habit to fix.",
        ge=0, lt=1)
    params: str | None = _f(
        None, "Orbax params dir to start from instead of the SFT warm start (e.g. another run's "
        "checkpoints/initial): comparisons then share one warm start.")


@dataclass(frozen=True)
class RewardSpec:
    """One reward function by registered name, with its weight in the total reward."""

    name: str = field(metadata=_rules("Registered reward function name."))
    weight: float = _f(1.0, "Weight in the summed reward.")


@dataclass(frozen=True)
class MeshConfig:
    """Device mesh with axes ('data', 'fsdp', 'tensor')."""

    data: int = _f(-1, "Data-parallel size; -1 = all remaining devices.", ge=1, allow=(-1,))
    fsdp: int = _f(1, "Fully-sharded data-parallel size.", ge=1)
    tensor: int = _f(1, "Tensor-parallel size.", ge=1)

    def shape(self, num_devices: int) -> tuple[int, int, int]:
        """Resolve ``data=-1`` and check ``data * fsdp * tensor == num_devices``."""
        rest = self.fsdp * self.tensor
        if self.data == -1:
            if num_devices % rest:
                raise ConfigError(
                    f"mesh: fsdp * tensor = {rest} must divide the {num_devices} devices"
                )
            return (num_devices // rest, self.fsdp, self.tensor)
        if self.data * rest != num_devices:
            raise ConfigError(
                f"mesh: data * fsdp * tensor = {self.data * rest} must equal the "
                f"{num_devices} devices (use mesh.data=-1 to fill)"
            )
        return (self.data, self.fsdp, self.tensor)


@dataclass(frozen=True)
class CheckpointConfig:
    """Orbax checkpointing."""

    every: int = _f(50, "Save every N steps; 0 = only at the end.", ge=0)
    keep: int = _f(3, "Checkpoints to keep.", ge=1)
    async_save: bool = _f(True, "Save in the background.")


@dataclass(frozen=True)
class DistributedConfig:
    """Multi-host ``jax.distributed`` initialisation."""

    initialize: Literal["auto", "always", "never"] = _f(
        "auto", "auto: initialise when a cluster environment is detected."
    )
    coordinator_address: str | None = _f(None, "host:port of process 0; None = auto-detect.")
    num_processes: int | None = _f(None, "Total processes; None = auto-detect.", ge=1)
    process_id: int | None = _f(None, "This process's index; None = auto-detect.", ge=0)


@dataclass(frozen=True)
class Config:
    """The whole configuration. Build with :func:`load_config` or :func:`config_from_dict`."""

    run: RunConfig = field(default_factory=RunConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    sagc: SAGCConfig = field(default_factory=SAGCConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    init: InitConfig = field(default_factory=InitConfig)
    rewards: tuple[RewardSpec, ...] = _f(
        (RewardSpec("exact_answer", 1.0),), "Reward functions summed with weights."
    )
    reward_on_error: Literal["raise", "zero"] = _f(
        "raise", "When a reward function raises: re-raise, or score the row 0."
    )
    mesh: MeshConfig = field(default_factory=MeshConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)

    def validate(self) -> Config:
        """Check every field (types, ranges, choices) and the cross-field rules.

        Useful after ``dataclasses.replace``. Returns ``self``; raises :class:`ConfigError`.
        """
        _build(Config, config_to_dict(self), "")
        self._check_cross()
        return self

    def _check_cross(self) -> None:
        """Rules that involve more than one field."""
        d, s, g, a, m = self.data, self.sampling, self.sagc, self.algo, self.model

        if d.task is not None and d.train_file is not None:
            _fail(
                "data.train_file",
                f"set data.task=null when using a train file "
                f"(got task={d.task!r}, train_file={d.train_file!r})",
            )
        if d.task is None and d.train_file is None:
            _fail("data.task", "exactly one of data.task and data.train_file must be set")
        if d.task_min_steps > d.task_max_steps:
            _fail(
                "data.task_min_steps",
                f"must be <= data.task_max_steps ({d.task_max_steps}), got {d.task_min_steps}",
            )

        if m.path is None:
            if m.num_heads % m.num_kv_heads:
                _fail(
                    "model.num_kv_heads",
                    f"must divide model.num_heads ({m.num_heads}), got {m.num_kv_heads}",
                )
            if m.head_dim is None and m.hidden_size % m.num_heads:
                _fail(
                    "model.hidden_size",
                    f"must be divisible by model.num_heads "
                    f"({m.num_heads}) when model.head_dim is null, got {m.hidden_size}",
                )

        _check_increasing("sampling.prompt_buckets", s.prompt_buckets)
        if s.cache_buckets is not None:
            _check_increasing("sampling.cache_buckets", s.cache_buckets)
            need = s.prompt_buckets[-1] + s.max_new_tokens
            if s.cache_buckets[-1] < need:
                _fail(
                    "sampling.cache_buckets",
                    f"largest must be >= largest prompt bucket + "
                    f"max_new_tokens ({need}), got {s.cache_buckets[-1]}",
                )

        _check_increasing("sagc.group_sizes", tuple(g.group_sizes))
        if g.initial_group_size not in g.group_sizes:
            _fail(
                "sagc.initial_group_size",
                f"must be one of sagc.group_sizes "
                f"{list(g.group_sizes)}, got {g.initial_group_size}",
            )

        if a.epsilon_high < a.epsilon:
            _fail(
                "algo.epsilon_high", f"must be >= algo.epsilon ({a.epsilon}), got {a.epsilon_high}"
            )
        if a.overlong_buffer >= s.max_new_tokens:
            _fail(
                "algo.overlong_buffer",
                f"must be < sampling.max_new_tokens ({s.max_new_tokens}), got {a.overlong_buffer}",
            )

        if not self.rewards:
            _fail("rewards", "must list at least one reward")
        for i, r in enumerate(self.rewards):
            if not r.name.strip():
                _fail(f"rewards[{i}].name", "must be a non-empty string")

        dist = self.distributed
        if (
            dist.process_id is not None
            and dist.num_processes is not None
            and dist.process_id >= dist.num_processes
        ):
            _fail(
                "distributed.process_id",
                f"must be < distributed.num_processes "
                f"({dist.num_processes}), got {dist.process_id}",
            )


# --------------------------------------------------------------------------------------------
# Generic validation / construction
# --------------------------------------------------------------------------------------------


def _fail(key: str, msg: str) -> typing.NoReturn:
    raise ConfigError(f"{key}: {msg}")


def _fmt(value: Any) -> str:
    """Render a value for an error message (repr, but lists for tuples)."""
    if isinstance(value, tuple):
        value = list(value)
    return repr(value)


def _check_increasing(key: str, values: tuple[int, ...]) -> None:
    if not values:
        _fail(key, "must not be empty")
    if any(b <= a for a, b in itertools.pairwise(values)):
        _fail(key, f"must be strictly increasing, got {_fmt(values)}")


def _is_union(tp: Any) -> bool:
    return typing.get_origin(tp) in (typing.Union, types.UnionType)


def _type_name(tp: Any) -> str:
    """Short human name for a type hint, used in 'expected ...' messages."""
    if tp is type(None):
        return "None"
    if _is_union(tp):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (tuple, list):
        args = [a for a in typing.get_args(tp) if a is not Ellipsis]
        return f"list of {_type_name(args[0])}" if args else "list"
    if origin in (dict, Mapping):
        return "mapping"
    if dataclasses.is_dataclass(tp):
        return "mapping"
    return getattr(tp, "__name__", str(tp))


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    """Resolved type hints of a dataclass (cached); unresolvable ones become ``Any``."""
    if cls not in _HINTS:
        try:
            hints = typing.get_type_hints(cls)
        except Exception:  # fall back to raw annotations
            hints = {
                f.name: (f.type if not isinstance(f.type, str) else Any)
                for f in dataclasses.fields(cls)
            }
        _HINTS[cls] = hints
    return _HINTS[cls]


def _convert(tp: Any, value: Any, key: str, expect: str | None = None) -> Any:
    """Check ``value`` against type hint ``tp`` and return it normalised (lists -> tuples...).

    ``expect`` overrides the type name used in a mismatch message (for ``X | None``).
    """
    expect = expect or _type_name(tp)

    def mismatch() -> typing.NoReturn:
        _fail(key, f"expected {expect}, got {_fmt(value)}")

    if tp is Any or tp is object:
        return value
    if _is_union(tp):
        args = typing.get_args(tp)
        if value is None:
            if type(None) in args:
                return None
            mismatch()
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1:
            return _convert(rest[0], value, key, expect)
        for a in rest:
            try:
                return _convert(a, value, key)
            except ConfigError:
                continue
        mismatch()
    origin = typing.get_origin(tp)
    if origin is Literal:
        allowed = typing.get_args(tp)
        if not any(value == a and type(value) is type(a) for a in allowed):
            _fail(key, f"must be one of {', '.join(repr(a) for a in allowed)}, got {_fmt(value)}")
        return value
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        if value is None:
            value = {}
        if not isinstance(value, Mapping):
            mismatch()
        return _build(tp, value, key + ".")
    if origin in (tuple, list):
        if not isinstance(value, (list, tuple)):
            mismatch()
        args = typing.get_args(tp)
        if origin is tuple and args and (len(args) != 2 or args[1] is not Ellipsis):
            if len(value) != len(args):
                _fail(key, f"expected a list of {len(args)} items, got {_fmt(value)}")
            elem_types = list(args)
        else:
            elem_types = [args[0] if args else Any] * len(value)
        items = [
            _convert(t, v, f"{key}[{i}]")
            for i, (t, v) in enumerate(zip(elem_types, value, strict=True))
        ]
        return tuple(items) if origin is tuple else items
    if origin in (dict, Mapping):
        if not isinstance(value, Mapping):
            mismatch()
        return dict(value)
    if tp is bool:
        if not isinstance(value, bool):
            mismatch()
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            mismatch()
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            mismatch()
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            mismatch()
        return value
    if isinstance(tp, type):
        if not isinstance(value, tp):
            mismatch()
        return value
    return value  # unknown hint kind: accept as is


def _field_rules(f: dataclasses.Field, key: str) -> Mapping[str, Any]:
    meta = f.metadata
    if any(k in meta for k in ("range", "choices", "allow")):
        return meta
    generic = re.sub(r"\[\d+\]", "[*]", key)
    return _EXTRA_RULES.get(generic, meta)


def _check_rules(rules: Mapping[str, Any], key: str, value: Any) -> None:
    """Apply declarative ``range`` / ``choices`` / ``allow`` rules (element-wise for tuples)."""
    rng: Range | None = rules.get("range")
    choices = rules.get("choices")
    allow = rules.get("allow", ())
    if value is None or (rng is None and choices is None):
        return
    if isinstance(value, (tuple, list)):
        items = [(f"{key}[{i}]", v) for i, v in enumerate(value)]
    else:
        items = [(key, value)]
    for k, v in items:
        if any(v == a and not isinstance(v, bool) for a in allow):
            continue
        if choices is not None and v not in choices:
            _fail(k, f"must be one of {', '.join(repr(c) for c in choices)}, got {_fmt(v)}")
        if rng is not None and isinstance(v, (int, float)) and not rng.contains(v):
            extra = " or ".join(str(a) for a in allow)
            _fail(k, f"must be {extra + ' or ' if extra else ''}{rng.describe()}, got {_fmt(v)}")


def _first_leaf(key: str, value: Any) -> str:
    """Descend into a mapping to name a full dotted key (``sagcc`` -> ``sagcc.delta``)."""
    while isinstance(value, Mapping) and value:
        k, value = next(iter(value.items()))
        key = f"{key}.{k}"
    return key


def _unknown_key(key: str) -> ConfigError:
    generic = re.sub(r"\[\d+\]", "[*]", key)
    match = difflib.get_close_matches(generic, config_keys(sections=True), n=1, cutoff=0.6)
    msg = f"unknown key {key!r}"
    if match:
        indices = iter(re.findall(r"\[\d+\]", key))
        suggestion = re.sub(r"\[\*\]", lambda _m: next(indices, "[0]"), match[0])
        msg += f" (did you mean {suggestion!r}?)"
    return ConfigError(msg)


def _build(cls: type, data: Mapping[str, Any], prefix: str) -> Any:
    """Validate ``data`` against dataclass ``cls`` (recursively) and construct it."""
    flds = {f.name: f for f in dataclasses.fields(cls) if f.init}
    for k, v in data.items():
        if k not in flds:
            raise _unknown_key(_first_leaf(f"{prefix}{k}", v))
    hints = _hints(cls)
    kwargs: dict[str, Any] = {}
    for name, f in flds.items():
        key = prefix + name
        if name in data:
            kwargs[name] = _convert(hints.get(name, Any), data[name], key)
            # Rules first, so a section's own __post_init__ never pre-empts these messages.
            _check_rules(_field_rules(f, key), key, kwargs[name])
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            _fail(key, "required")
    section = prefix.rstrip(".") or cls.__name__
    try:
        obj = cls(**kwargs)
    except ConfigError:
        raise
    except (ValueError, TypeError) as e:
        _fail(section, str(e))
    for name, f in flds.items():  # defaults (incl. default_factory) obey the rules too
        if name not in kwargs:
            _check_rules(_field_rules(f, prefix + name), prefix + name, getattr(obj, name))
    validate = getattr(obj, "validate", None)
    if cls is not Config and callable(validate):
        try:
            validate()
        except ConfigError:
            raise
        except ValueError as e:
            msg = str(e)
            msg = msg if prefix and msg.startswith(prefix) else f"{section}: {msg}"
            raise ConfigError(msg) from None
    return obj


def config_keys(cls: type | None = None, *, sections: bool = False) -> list[str]:
    """All valid dotted keys (leaves; with ``sections`` also section names).

    Items of list-of-dataclass fields appear as ``rewards[*].weight``.
    """
    out: list[str] = []

    def walk(c: type, prefix: str) -> None:
        hints = _hints(c)
        for f in dataclasses.fields(c):
            if not f.init:
                continue
            tp = hints.get(f.name, Any)
            if _is_union(tp):
                rest = [a for a in typing.get_args(tp) if a is not type(None)]
                tp = rest[0] if len(rest) == 1 else tp
            key = prefix + f.name
            args = typing.get_args(tp)
            if dataclasses.is_dataclass(tp) and isinstance(tp, type):
                if sections:
                    out.append(key)
                walk(tp, key + ".")
            elif (
                typing.get_origin(tp) in (tuple, list)
                and args
                and dataclasses.is_dataclass(args[0])
            ):
                out.append(key)
                walk(args[0], key + "[*].")
            else:
                out.append(key)

    walk(cls or Config, "")
    return out


# --------------------------------------------------------------------------------------------
# YAML, overrides, public API
# --------------------------------------------------------------------------------------------


class _Loader(yaml.SafeLoader):
    """SafeLoader that also reads ``1e-4`` / ``3E5`` (no dot) as floats, like YAML 1.2."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def _yaml_load(text: str) -> Any:
    return yaml.load(text, Loader=_Loader)  # _Loader is a SafeLoader


def _merge(base: Any, new: Any) -> Any:
    """Deep-merge mappings; ``None`` over a section keeps the section; otherwise replace."""
    if isinstance(base, Mapping) and new is None:
        return base
    if isinstance(base, Mapping) and isinstance(new, Mapping):
        out = dict(base)
        for k, v in new.items():
            out[k] = _merge(out[k], v) if k in out else v
        return out
    return new


_PATH_PART = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)((?:\[\d+\])*)$")


def _parse_path(key: str) -> list[str | int]:
    parts: list[str | int] = []
    for piece in key.split("."):
        m = _PATH_PART.match(piece)
        if not m:
            raise ConfigError(
                f"bad override key {key!r}: expected a dotted path like "
                f"'sagc.delta' or 'rewards[0].weight'"
            )
        parts.append(m.group(1))
        parts.extend(int(i) for i in re.findall(r"\[(\d+)\]", m.group(2)))
    return parts


def apply_overrides(d: Mapping[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Return a copy of nested dict ``d`` with ``key=value`` overrides applied.

    Values are YAML (``sagc.group_sizes=[4,8]``, ``model.path=null``); mapping values are
    merged into existing sections. List items are addressed as ``rewards[0].weight``.
    """
    root: dict[str, Any] = _merge({}, d)
    for ov in overrides:
        if "=" not in ov:
            raise ConfigError(f"bad override {ov!r}: expected key=value")
        key, raw = ov.split("=", 1)
        key = key.strip()
        try:
            value = _yaml_load(raw)
        except yaml.YAMLError as e:
            raise ConfigError(
                f"{key}: cannot parse value {raw!r} as YAML ({' '.join(str(e).split())})"
            ) from None
        path = _parse_path(key)
        cur: Any = root
        for i, part in enumerate(path):
            last = i == len(path) - 1
            where = key if last else ".".join(str(p) for p in path[: i + 1])
            if isinstance(part, int):
                if not isinstance(cur, list):
                    raise ConfigError(f"{where}: not a list, cannot index it")
                if part > len(cur):
                    raise ConfigError(
                        f"{key}: index {part} out of range (list has "
                        f"{len(cur)} items; use index {len(cur)} to append)"
                    )
                if part == len(cur):
                    cur.append({} if not last else None)
                if last:
                    cur[part] = _merge(cur[part], value)
                else:
                    if cur[part] is None:
                        cur[part] = {} if isinstance(path[i + 1], str) else []
                    cur[part] = _copy(cur[part])
                    cur = cur[part]
            else:
                if not isinstance(cur, dict):
                    raise ConfigError(f"{key}: {where.rsplit('.', 1)[0]!r} is not a section")
                if last:
                    cur[part] = _merge(cur.get(part), value)
                else:
                    if cur.get(part) is None:
                        cur[part] = {} if isinstance(path[i + 1], str) else []
                    cur[part] = _copy(cur[part])
                    cur = cur[part]
    return root


def _copy(v: Any) -> Any:
    if isinstance(v, Mapping):
        return dict(v)
    if isinstance(v, (list, tuple)):
        return list(v)
    return v


def config_from_dict(d: Mapping[str, Any]) -> Config:
    """Validate a nested dict (missing keys take defaults) and build a :class:`Config`."""
    if not isinstance(d, Mapping):
        raise ConfigError(f"config: expected a mapping at the top level, got {_fmt(d)}")
    cfg = _build(Config, d, "")
    cfg._check_cross()
    return cfg


def config_to_dict(cfg: Any) -> Any:
    """Plain nested dict/list/scalar form of a config (tuples become lists), YAML-safe."""
    if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
        return {
            f.name: config_to_dict(getattr(cfg, f.name)) for f in dataclasses.fields(cfg) if f.init
        }
    if isinstance(cfg, (list, tuple)):
        return [config_to_dict(v) for v in cfg]
    if isinstance(cfg, Mapping):
        return {k: config_to_dict(v) for k, v in cfg.items()}
    return cfg


def load_config(path: str | os.PathLike[str] | None, overrides: list[str] | None = None) -> Config:
    """Load a YAML config (``None`` = all defaults), apply ``key=value`` overrides, validate."""
    data: Any = {}
    if path is not None:
        try:
            with open(path, encoding="utf-8") as fh:
                text = fh.read()
        except FileNotFoundError:
            raise ConfigError(f"config file not found: {os.fspath(path)!r}") from None
        except OSError as e:
            raise ConfigError(
                f"cannot read config file {os.fspath(path)!r}: {e.strerror}"
            ) from None
        try:
            data = _yaml_load(text)
        except yaml.YAMLError as e:
            raise ConfigError(
                f"{os.fspath(path)}: invalid YAML ({' '.join(str(e).split())})"
            ) from None
        if data is None:
            data = {}
        if not isinstance(data, Mapping):
            raise ConfigError(
                f"{os.fspath(path)}: expected a mapping at the top level, got {type(data).__name__}"
            )
    base = config_to_dict(Config())
    merged = _merge(base, data)
    if overrides:
        merged = apply_overrides(merged, list(overrides))
    return config_from_dict(merged)


def save_config(cfg: Config, path: str | os.PathLike[str]) -> None:
    """Write the resolved config as YAML; :func:`load_config` reads it back to an equal Config."""
    parent = os.path.dirname(os.fspath(path))
    if parent:
        os.makedirs(parent, exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        yaml.safe_dump(config_to_dict(cfg), fh, sort_keys=False, default_flow_style=None)
