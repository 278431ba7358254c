"""The config schema: every section declared once, with defaults, docs and rules.

The ``sagc:`` section is :class:`~sagc_jax.config.sagc.SAGCConfig` (its own module, read by
the controller and the simulator). Rules that involve one section live on it
(``model_validator``); :class:`Config` holds only the rules that span sections. See
:mod:`sagc_jax.config.load` for YAML and ``key=value`` overrides.
"""

from __future__ import annotations

import itertools
import json
import typing
from collections.abc import Mapping
from importlib import resources
from typing import Annotated, Any, Literal

from annotated_types import Ge
from pydantic import AfterValidator, Field, model_validator

from sagc_jax.config.base import Bool, Float, Int, Section, Str, field, rule_error
from sagc_jax.config.env import EnvConfig
from sagc_jax.config.errors import ConfigError, fmt
from sagc_jax.config.sagc import SAGCConfig

__all__ = [
    "AlgoConfig",
    "CheckpointConfig",
    "Config",
    "DataConfig",
    "DistributedConfig",
    "EnvConfig",
    "InitConfig",
    "LoRASection",
    "MeshConfig",
    "ModelSection",
    "OptimConfig",
    "RewardSpec",
    "RunConfig",
    "SAGCConfig",
    "SamplingSection",
]

PosInt = Annotated[Int, Ge(1)]


def preset_names() -> tuple[str, ...]:
    """Names of the shipped architecture presets (``sagc_jax/models/presets/*.json``), read
    without importing the model code (the config stays importable without jax)."""
    folder = resources.files("sagc_jax").joinpath("models", "presets")
    return tuple(sorted(f.name.removesuffix(".json") for f in folder.iterdir()
                        if f.name.endswith(".json")))


def check_increasing(field_name: str, values: tuple[int, ...]) -> None:
    """Raise a rule error unless ``values`` is non-empty and strictly increasing."""
    if not values:
        raise rule_error(field_name, "must not be empty")
    if any(b <= a for a, b in itertools.pairwise(values)):
        raise rule_error(field_name, f"must be strictly increasing, got {fmt(values)}")


class RunConfig(Section):
    """Run bookkeeping: output directory, length, logging, resuming."""

    section_key = "run"
    dir: Str = field("runs/tiny", "Output directory (config.yaml, metrics.jsonl, checkpoints).")
    steps: Int = field(200, "Number of GRPO training steps.", ge=1)
    seed: Int = field(0, "Global seed (params init, data order, sampling keys).")
    resume: Literal["auto", "never", "required"] = field(
        "auto",
        "auto: resume if a checkpoint exists in run.dir; never: start fresh; "
        "required: fail without a checkpoint.",
    )
    log_every: Int = field(1, "Print/log a metrics line every N steps.", ge=1)
    progress: Bool = field(True, "Show progress bars (compile warm-up, training).")
    eval_every: Int = field(0, "Evaluate every N steps; 0 = off.", ge=0)
    plots: Bool = field(True, "Write PNG plots of the run.")


LoRATarget = Literal["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


class LoRASection(Section):
    """LoRA adapters (``model.lora:``) on the stacked layer weights; see docs/lora.md.

    Only the adapters are trained (and carry AdamW state); the base stays frozen, and with
    ``algo.beta > 0`` the KL reference is the base with adapters off (no second copy).
    """

    section_key = "model.lora"
    rank: PosInt = field(16, "Adapter rank r.")
    alpha: Float = field(32.0, "Adapter scale numerator: the update is (alpha / rank) * A @ B.",
                         gt=0)
    targets: tuple[LoRATarget, ...] = field(
        ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
        "Layer weights that get an adapter (HF module names).")
    dropout: Float = field(0.0, "Adapter input dropout; only 0.0 is implemented.", ge=0, lt=1)

    @model_validator(mode="after")
    def _rules(self) -> LoRASection:
        if not self.targets:
            raise rule_error("targets", "must list at least one layer weight")
        if len(set(self.targets)) != len(self.targets):
            raise rule_error("targets", f"must not repeat a weight, got {fmt(self.targets)}")
        if self.dropout != 0.0:
            raise rule_error("dropout", f"only 0.0 is implemented (adapter dropout is not), got "
                             f"{self.dropout}")
        return self


class ModelSection(Section):
    """Policy model (``model:``). With ``path`` set the architecture comes from the HF config
    there; otherwise :func:`sagc_jax.models.config.from_run_section` builds a ``ModelConfig``."""

    section_key = "model"
    path: Str | None = field(
        None, "HF model directory (config.json + safetensors) or a .gguf file (weights, "
        "tokenizer and chat template); None = fresh random model."
    )
    tokenizer: Str | None = field(
        None, "HF tokenizer directory or .gguf file; None = model.path's own tokenizer, else "
        "the built-in tokenizer shipped with the package."
    )
    model_type: Literal["llama", "qwen2"] = field("llama", "Model family (fresh models only).")
    hidden_size: Int = field(128, "Residual width.", ge=1)
    intermediate_size: Int = field(384, "SwiGLU MLP width.", ge=1)
    num_layers: Int = field(4, "Number of transformer blocks.", ge=1)
    num_heads: Int = field(4, "Query heads.", ge=1)
    num_kv_heads: Int = field(2, "Key/value heads (GQA); must divide num_heads.", ge=1)
    head_dim: Int | None = field(None, "Per-head width; None = hidden_size // num_heads.", ge=1)
    rope_theta: Float = field(10000.0, "RoPE base frequency.", gt=0)
    max_position_embeddings: Int = field(
        512, "Maximum sequence length (prompt + completion).", ge=1
    )
    tie_word_embeddings: Bool = field(True, "Share input embedding and LM head.")
    attention_bias: Bool = field(False, "Bias on q/k/v projections (Qwen2 style).")
    preset: Str | None = field(
        None, "Architecture preset (e.g. qwen2.5-0.5b; sagc_jax/models/presets/*.json): the dry "
        "run sizes the run from it when model.path holds no config.json; a real model.path wins."
    )
    dtype: Literal["float32", "bfloat16"] = field(
        "float32", "Compute dtype of the policy and sampler (matmul inputs, KV cache)."
    )
    param_dtype: Literal["float32", "bfloat16"] = field(
        "float32", "Storage dtype of the params, their gradients and AdamW moments; bfloat16 "
        "halves them, but an update smaller than ~2^-8 of a weight rounds away."
    )
    remat: Bool = field(False, "Rematerialise transformer blocks in the backward pass.")
    matmul_dtype: Literal["float32", "bfloat16"] | None = field(
        None,
        "Operand dtype of every dense and LM-head matmul (train step, log-prob passes, prefill, "
        "decode, evals); null = model.dtype. bfloat16 under a float32 model is mixed precision "
        "as torch autocast / TRL's bf16=True: bf16 operands, float32 accumulation, float32 "
        "master weights, norms, softmax, KV cache and loss (models/precision.py). ~2x the "
        "matmul rate on CPUs with AVX512-BF16 and half decode's weight read; the policy is then "
        "the bf16-rounded one.",
    )
    lora: LoRASection | None = field(
        None, "LoRA adapters ({rank, alpha, targets, dropout}); None = full fine-tuning.")

    @model_validator(mode="after")
    def _preset(self) -> ModelSection:
        if self.preset is not None:
            names = preset_names()
            if self.preset.strip().lower() not in names:
                raise rule_error("preset", f"unknown preset {self.preset!r}; known: "
                                 f"{', '.join(names)}")
        return self

    @model_validator(mode="after")
    def _heads(self) -> ModelSection:
        if self.path is None:
            if self.num_heads % self.num_kv_heads:
                raise rule_error(
                    "num_kv_heads",
                    f"must divide model.num_heads ({self.num_heads}), got {self.num_kv_heads}",
                )
            if self.head_dim is None and self.hidden_size % self.num_heads:
                raise rule_error(
                    "hidden_size",
                    f"must be divisible by model.num_heads ({self.num_heads}) when "
                    f"model.head_dim is null, got {self.hidden_size}",
                )
        return self


class _FrozenDict(dict):
    """A dict that hashes by its JSON text, so sections holding one stay hashable."""

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(json.dumps(self, sort_keys=True, default=repr))


def _frozen(value: dict[str, Any]) -> dict[str, Any]:
    return _FrozenDict(value)


class DataConfig(Section):
    """Prompt source: a built-in task or a JSONL/Parquet file."""

    section_key = "data"
    task: Str | None = field("arith", "Built-in task name; set to null when train_file is given.")
    train_file: Str | None = field(None, "JSONL or Parquet training prompts.")
    eval_file: Str | None = field(None, "JSONL or Parquet evaluation prompts.")
    prompt_column: Str = field("prompt", "Column holding the prompt text.")
    answer_column: Str = field("answer", "Column holding the reference answer.")
    solution_column: Str = field(
        "solution",
        "Column holding a reference completion per prompt (a file's; a built-in task has its "
        "own): what the SFT warm start (init.sft_steps > 0) trains on.",
    )
    prompts_per_step: Int = field(8, "Distinct prompts per step (each gets G rollouts).", ge=1)
    shuffle: Bool = field(True, "Shuffle prompts each epoch.")
    num_epochs: Int | None = field(None, "Passes over the data; None = repeat forever.", ge=1)
    chat_template: Bool = field(False, "Wrap prompts with the tokenizer's chat template.")
    num_eval: Int = field(200, "Held-out examples generated for a built-in task.", ge=0)
    task_min_steps: Int = field(1, "Built-in task: minimum reasoning steps per problem.", ge=1)
    task_max_steps: Int = field(12, "Built-in task: maximum reasoning steps per problem.", ge=1)
    task_ramble_rate: Float | None = field(
        None,
        "Built-in task `ramble` only: fraction of SFT demonstrations that loop on a line (how "
        "often the warm-started policy rambles); None = the task's default (0.06).",
        ge=0,
        lt=1,
    )
    task_options: Annotated[dict[Str, Any], AfterValidator(_frozen)] | None = field(
        None,
        "Built-in task options for its factory, e.g. for task reasoning_gym {system_prompt: "
        "default, datasets: {chain_sum: {weight: 1, min_terms: 2}}} (docs/tasks.md); checked "
        "when the task is built.",
    )
    worker_count: Int = field(0, "grain worker processes; 0 = in-process.", ge=0)
    shards: Int | None = field(
        None,
        "Virtual data shards (a multiple of the process count; prompts_per_step must divide by "
        "it); None = one per process. Fixing it makes the prompt order independent of how many "
        "processes run.",
        ge=1,
    )

    @model_validator(mode="after")
    def _source(self) -> DataConfig:
        if self.task is not None and self.train_file is not None:
            raise rule_error(
                "train_file",
                f"set data.task=null when using a train file "
                f"(got task={self.task!r}, train_file={self.train_file!r})",
            )
        if self.task is None and self.train_file is None:
            raise rule_error("task", "exactly one of data.task and data.train_file must be set")
        if self.task_ramble_rate is not None and self.task != "ramble":
            raise rule_error(
                "task_ramble_rate",
                f"applies to data.task=ramble only (got task={self.task!r})",
            )
        if self.task_min_steps > self.task_max_steps:
            raise rule_error(
                "task_min_steps",
                f"must be <= data.task_max_steps ({self.task_max_steps}), "
                f"got {self.task_min_steps}",
            )
        return self


class SamplingSection(Section):
    """Rollout generation and its compiled shape set (``sampling:``)."""

    section_key = "sampling"
    max_new_tokens: Int = field(128, "Maximum completion tokens per row.", ge=1)
    temperature: Float = field(1.0, "Sampling temperature.", gt=0)
    top_k: Int | None = field(None, "Keep the k most likely tokens; None = off.", ge=1)
    top_p: Float | None = field(None, "Nucleus sampling mass; None = off.", gt=0, le=1)
    prompt_buckets: tuple[PosInt, ...] = field(
        (32, 64, 128), "Prompt lengths (tokens) prompts are padded up to; strictly increasing."
    )
    cache_buckets: tuple[PosInt, ...] | None = field(
        None, "KV-cache lengths; None = derived from prompt_buckets + max_new_tokens."
    )
    decode_chunk: Int = field(16, "Decode tokens per chunk inside the while loop.", ge=1)
    prompt_too_long: Literal["error", "truncate"] = field(
        "error", "What to do with a prompt longer than the largest bucket."
    )

    @model_validator(mode="after")
    def _buckets(self) -> SamplingSection:
        check_increasing("prompt_buckets", self.prompt_buckets)
        if self.cache_buckets is not None:
            check_increasing("cache_buckets", self.cache_buckets)
            need = self.prompt_buckets[-1] + self.max_new_tokens
            if self.cache_buckets[-1] < need:
                raise rule_error(
                    "cache_buckets",
                    f"largest must be >= largest prompt bucket + max_new_tokens ({need}), "
                    f"got {self.cache_buckets[-1]}",
                )
        return self


class AlgoConfig(Section):
    """GRPO / DAPO / Dr. GRPO / GSPO objective (docs/algorithms.md)."""

    section_key = "algo"
    beta: Float = field(0.0, "KL weight; 0 = no reference model.", ge=0)
    kl_estimator: Literal["k1", "k3"] = field("k3", "KL estimator (Schulman's k1 or k3).")
    epsilon: Float = field(0.2, "Lower PPO clip range (ratio >= 1 - epsilon).", gt=0, lt=1)
    epsilon_high: Float = field(
        0.28, "Upper clip range (ratio <= 1 + epsilon_high); DAPO clip-higher.", gt=0
    )
    loss_agg: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"] = field(
        "token-mean", "How per-token losses are aggregated."
    )
    num_iterations: Int = field(1, "Optimisation passes (mu) per batch of rollouts.", ge=1)
    importance_sampling: Literal["token", "sequence"] = field(
        "token", "Importance ratio per token (GRPO) or per sequence, length-normalised (GSPO)."
    )
    clip_delta: Float | None = field(
        None, "Two-sided clipping: cap of the unclipped ratio (> 1 + epsilon_high); None = off.",
        gt=1,
    )
    kl_bias_correction: Bool = field(
        False, "Multiply the KL estimate by the token ratio (DeepSeek-V3.2 unbiased estimator)."
    )
    scale_rewards: Literal["group", "batch", "none"] = field(
        "group", "Advantage (r - group mean) / std of the group, of the batch, or none (Dr. GRPO)."
    )
    std_ddof: Int = field(
        0, "Reward std estimator: 0 population, 1 unbiased (TRL).", ge=0, le=1
    )
    adv_eps: Float = field(1e-4, "Epsilon added to the reward std (TRL's 1e-4).", gt=0)
    top_entropy_quantile: Float = field(
        1.0, "Policy loss only on the top fraction of tokens by entropy (0.2 in the 80/20 "
        "paper); 1 = all.", ge=0, le=1,
    )
    off_policy_mask_threshold: Float | None = field(
        None, "Drop the policy-gradient term of negative-advantage sequences whose mean token "
        "log(pi_old / pi) exceeds this (nats; DeepSeek-V3.2, TRL's off_policy_mask_threshold); "
        "None = off.", ge=0,
    )
    micro_batch_rows: Int | None = field(
        None, "Rows per gradient-accumulation micro-batch; None = whole batch.", ge=1
    )
    dynamic_sampling: Bool = field(False, "DAPO: drop groups whose rewards are all equal.")
    dynamic_sampling_rounds: Int = field(
        0, "Extra sampling rounds to refill dropped groups (0 = none).", ge=0
    )
    overlong_buffer: Int = field(
        0, "DAPO soft overlong punishment window (tokens before the limit); 0 = off.", ge=0
    )
    overlong_penalty: Float = field(1.0, "Maximum overlong penalty (reached at the limit).", ge=0)
    mask_truncated: Bool = field(False, "Exclude truncated completions from the loss.")
    packing: Bool = field(
        True,
        "Pack several (prompt + completion) sequences into each row of pack_len slots for the "
        "train step and the log-prob passes, a group's prompt once per row (exact); false = "
        "one sequence per row (the same steps, more slots computed).",
    )
    pack_len: PosInt | None = field(
        None, "Slots per packed row; None = largest prompt bucket + max_new_tokens - 1, rounded "
        "up to 8."
    )
    pack_chunk_rows: tuple[PosInt, ...] | None = field(
        None,
        "Declared packed-row counts of the compiled chunks an update runs (one compile each); "
        "None = micro_batch_rows (or 8 x data x fsdp) halved while a multiple of data x fsdp.",
    )

    @model_validator(mode="after")
    def _clip(self) -> AlgoConfig:
        if self.epsilon_high < self.epsilon:
            raise rule_error(
                "epsilon_high", f"must be >= algo.epsilon ({self.epsilon}), got {self.epsilon_high}"
            )
        if self.clip_delta is not None and self.clip_delta <= 1 + self.epsilon_high:
            raise rule_error(
                "clip_delta",
                f"must be > 1 + algo.epsilon_high ({1 + self.epsilon_high}), got {self.clip_delta}",
            )
        return self


class OptimConfig(Section):
    """AdamW with warm-up and cosine/constant schedule."""

    section_key = "optim"
    lr: Float = field(1e-4, "Peak learning rate.", gt=0)
    warmup_steps: Int = field(10, "Linear warm-up steps.", ge=0)
    schedule: Literal["cosine", "constant"] = field("cosine", "Decay after warm-up.")
    min_lr_ratio: Float = field(0.1, "Final lr as a fraction of peak (cosine).", ge=0, le=1)
    weight_decay: Float = field(0.0, "Decoupled weight decay.", ge=0)
    b1: Float = field(0.9, "Adam beta1.", ge=0, lt=1)
    b2: Float = field(0.99, "Adam beta2.", ge=0, lt=1)
    eps: Float = field(1e-8, "Adam epsilon.", gt=0)
    max_grad_norm: Float = field(1.0, "Global-norm gradient clipping; 0 = off.", ge=0)


class InitConfig(Section):
    """Optional supervised warm start before RL (built-in tasks)."""

    section_key = "init"
    sft_steps: Int = field(0, "SFT steps before GRPO; 0 = none.", ge=0)
    sft_lr: Float = field(1e-3, "SFT learning rate.", gt=0)
    sft_batch_size: Int = field(32, "SFT examples per step.", ge=1)
    sft_format_noise: Float = field(
        0.0,
        "Fraction of SFT solutions whose answer line is written 'answer: N' instead of "
        "'#### N' (which the exact_answer reward needs): GRPO then has a format habit to fix.",
        ge=0,
        lt=1,
    )
    params: Str | None = field(
        None,
        "Orbax params dir to start from instead of the SFT warm start (e.g. another run's "
        "checkpoints/initial): comparisons then share one warm start.",
    )
    seed: Int | None = field(
        None,
        "Seed of the warm start (random model weights, SFT data order and format noise); "
        "None = run.seed. Runs that set it share one warm start across run seeds, as runs "
        "from one pretrained checkpoint do; run.seed then varies only the RL part.",
    )


class RewardSpec(Section):
    """One reward function by registered name, with its weight in the total reward."""

    section_key = "rewards[*]"
    positional = ("name", "weight")
    name: Str = field(doc="Registered reward function name.")
    weight: Float = field(1.0, "Weight in the summed reward.")

    @model_validator(mode="after")
    def _name(self) -> RewardSpec:
        if not self.name.strip():
            raise rule_error("name", "must be a non-empty string")
        return self


def _data_size(v: int) -> int:
    if v != -1 and v < 1:
        raise rule_error("", f"must be -1 or >= 1, got {v}")
    return v


class MeshConfig(Section):
    """Device mesh with axes ('data', 'fsdp', 'tensor')."""

    section_key = "mesh"
    data: Annotated[Int, AfterValidator(_data_size)] = field(
        -1, "Data-parallel size; -1 = all remaining devices."
    )
    fsdp: Int = field(1, "Fully-sharded data-parallel size.", ge=1)
    tensor: Int = field(1, "Tensor-parallel size.", ge=1)

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


class CheckpointConfig(Section):
    """Orbax checkpointing."""

    section_key = "checkpoint"
    every: Int = field(50, "Save every N steps; 0 = only at the end.", ge=0)
    keep: Int = field(3, "Checkpoints to keep.", ge=1)
    async_save: Bool = field(True, "Save in the background.")


class DistributedConfig(Section):
    """Multi-host ``jax.distributed`` initialisation."""

    section_key = "distributed"
    initialize: Literal["auto", "always", "never"] = field(
        "auto", "auto: initialise when a cluster environment is detected."
    )
    coordinator_address: Str | None = field(None, "host:port of process 0; None = auto-detect.")
    num_processes: Int | None = field(None, "Total processes; None = auto-detect.", ge=1)
    process_id: Int | None = field(None, "This process's index; None = auto-detect.", ge=0)

    @model_validator(mode="after")
    def _ids(self) -> DistributedConfig:
        n, i = self.num_processes, self.process_id
        if i is not None and n is not None and i >= n:
            raise rule_error(
                "process_id", f"must be < distributed.num_processes ({n}), got {i}"
            )
        return self


class Config(Section):
    """The whole configuration. Build with :func:`load_config` or :func:`config_from_dict`."""

    run: RunConfig = Field(default_factory=RunConfig)
    model: ModelSection = Field(default_factory=ModelSection)
    data: DataConfig = Field(default_factory=DataConfig)
    sampling: SamplingSection = Field(default_factory=SamplingSection)
    sagc: SAGCConfig = Field(default_factory=SAGCConfig)
    algo: AlgoConfig = Field(default_factory=AlgoConfig)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    init: InitConfig = Field(default_factory=InitConfig)
    rewards: tuple[RewardSpec, ...] = field(
        (RewardSpec("exact_answer", 1.0),), "Reward functions summed with weights."
    )
    reward_on_error: Literal["raise", "zero"] = field(
        "raise", "When a reward function raises or times out: stop the run with an error naming "
        "the function and example (the state from before the step is saved), or score the row 0 "
        "with a warning."
    )
    reward_timeout_s: Float | None = field(
        None, "Seconds one reward-function call may take; a call that takes longer is a failure "
        "handled by reward_on_error (the stuck call is abandoned in a background thread, not "
        "killed). None = wait forever.", gt=0
    )
    env: EnvConfig | None = field(
        None, "Multi-turn episodes against an environment (docs/environments.md); None = "
        "single-turn rollouts.")
    mesh: MeshConfig = Field(default_factory=MeshConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    distributed: DistributedConfig = Field(default_factory=DistributedConfig)

    @property
    def warm_start_seed(self) -> int:
        """Seed of the model's random init and the SFT warm start: `init.seed`, else `run.seed`."""
        return self.run.seed if self.init.seed is None else self.init.seed

    @model_validator(mode="before")
    @classmethod
    def _null_sections(cls, data: Any) -> Any:
        """``sagc: null`` (an empty YAML section) means the section's defaults."""
        if isinstance(data, Mapping):
            return {
                k: {} if v is None and k in _SECTIONS else v for k, v in data.items()
            }
        return data

    @model_validator(mode="after")
    def _across_sections(self) -> Config:
        """Rules that involve more than one section."""
        a, s = self.algo, self.sampling
        if a.overlong_buffer >= s.max_new_tokens:
            raise rule_error(
                "algo.overlong_buffer",
                f"must be < sampling.max_new_tokens ({s.max_new_tokens}), got {a.overlong_buffer}",
            )
        if not self.rewards:
            raise rule_error("rewards", "must list at least one reward")
        if self.env is not None and a.dynamic_sampling:
            raise rule_error("algo.dynamic_sampling", "does not refill multi-turn episodes "
                             "(env: is set); set it to false")
        return self


_SECTIONS = frozenset(
    name
    for name, f in Config.model_fields.items()
    if typing.get_origin(f.annotation) is None and issubclass(f.annotation, Section)
)
