"""Built-in task ``reasoning_gym``: problems from reasoning-gym's procedural generators.

`reasoning-gym <https://github.com/open-thought/reasoning-gym>`_ (``reasoning-gym==0.1.25``)
generates problems offline, each dataset with its own verifier (``score_answer``). The config
names the datasets, their weights and generator settings::

    data:
      task: reasoning_gym
      task_options:
        system_prompt: default        # a key of reasoning_gym.utils.SYSTEM_PROMPTS, or null
        extra_instruction: null       # text added after it, e.g. how to call a tool
        calc_rate: 0.0                # SFT solutions written as calculator tool traces
        datasets:
          chain_sum: {weight: 1, min_terms: 2, max_terms: 3}
          leg_counting: {weight: 1}

(reasoning-gym's own composite form, ``datasets: [{name: chain_sum, weight: 1, config: {...}}]``,
is accepted too). The mix is reasoning-gym's ``CompositeDataset``: example ``i`` picks a dataset by
weight, then that dataset's entry ``i``.

**Prompt**: the instruction (the named system prompt, which asks for a final
``<answer>…</answer>``, then ``extra_instruction`` if set: reasoning-gym's prompts know no
tools, so a tool-using run says here how to call one) then a blank line then the question, as
one text — with ``data.chat_template`` the whole text is the user turn.

**SFT reference** (``init.sft_steps``):
``<answer>{answer}</answer>``; a dataset whose entries have no single oracle answer
(``answer`` is None, e.g. ``rubiks_cube``) gives no ``solution``. With ``calc_rate`` > 0, that
fraction of the entries whose metadata has an ``expression`` and whose answer is an integer
(chain_sum, basic_arithmetic, ...) get a tool trace for the built-in ``calculator``
environment instead: ``["<calc>{expression}</calc>", "={answer}\n",
"<answer>{answer}</answer>"]`` (the model's call, the tool's reply, the answer; chosen by a
stable hash of the question).

**Columns** passed to reward functions: ``answer`` (the oracle answer text), ``rg_dataset``
(name), ``rg_entry`` (the reasoning-gym entry: question, answer, metadata — what
``score_answer`` takes) and ``rg_config`` (that dataset's generator settings as JSON, so the
verifier is built with the same settings).

**Splits**: a question belongs to the held-out split when a stable hash of its text falls in one
of ``HELDOUT_BUCKETS`` buckets, so no held-out question is ever a training question (even for a
generator with few distinct questions). Held-out examples come from the fixed seed
``HELDOUT_SEED`` (the first ``data.num_eval`` held-out questions of that stream); training
example ``i`` of run seed ``s`` is entry ``i`` of a composite seeded from ``(s, draw)``, redrawn
with the next ``draw`` while the question is held-out. Every example is a pure function of its
arguments; the training source is lazy and random-access.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from sagc_jax.config.errors import ConfigError, unknown_key
from sagc_jax.data.task import LazySource, Task

__all__ = [
    "HELDOUT_BUCKETS",
    "HELDOUT_SEED",
    "KEY",
    "DatasetChoice",
    "ReasoningGymOptions",
    "ReasoningGymSource",
    "heldout_examples",
    "parse_options",
    "question_split",
    "reasoning_gym_task",
]

#: Config key every option error names.
KEY = "data.task_options"
#: One question in ``HELDOUT_BUCKETS`` (by stable hash) is held-out only.
HELDOUT_BUCKETS = 8
#: Seed of the held-out stream (training seeds are hashed from ``run.seed``).
HELDOUT_SEED = 1_000_003
_MAX_DRAWS = 32  # a train draw is held-out with p = 1/8: 32 misses in a row ~ 1e-29
_LENGTH_SAMPLE = 512  # training examples scanned for the longest prompts
_MANAGED = ("seed", "size")  # generator settings the task sets itself
_INT = re.compile(r"-?\d+")


def question_split(question: str) -> str:
    """``"eval"`` or ``"train"``: the split a question belongs to (stable across runs)."""
    h = int.from_bytes(hashlib.blake2b(question.encode(), digest_size=8).digest(), "little")
    return "eval" if h % HELDOUT_BUCKETS == 0 else "train"


def _unit_hash(salt: str, text: str) -> float:
    """A stable number in [0, 1) for ``text`` (independent of the split's hash by ``salt``)."""
    digest = hashlib.blake2b(f"{salt}:{text}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2.0**64


@dataclasses.dataclass(frozen=True)
class DatasetChoice:
    """One dataset of the mix: reasoning-gym name, sampling weight, generator settings."""

    name: str
    weight: float
    config: Mapping[str, Any]

    @property
    def config_json(self) -> str:
        """The settings as canonical JSON (the ``rg_config`` column)."""
        return json.dumps(dict(self.config), sort_keys=True)


@dataclasses.dataclass(frozen=True)
class ReasoningGymOptions:
    """Validated ``data.task_options`` of the ``reasoning_gym`` task."""

    datasets: tuple[DatasetChoice, ...]
    system_prompt: str | None = "default"
    extra_instruction: str | None = None
    calc_rate: float = 0.0

    @property
    def instruction(self) -> str:
        """The text put before each question ("" without a system prompt or extra text)."""
        from reasoning_gym.utils import SYSTEM_PROMPTS

        parts = [SYSTEM_PROMPTS[self.system_prompt].strip() if self.system_prompt else "",
                 (self.extra_instruction or "").strip()]
        return "\n\n".join(p for p in parts if p)

    def description(self) -> str:
        """One line for logs."""
        mix = ", ".join(f"{d.name} x{d.weight:g}" for d in self.datasets)
        return f"reasoning-gym datasets ({mix}), system prompt {self.system_prompt}"

    def composite(self, seed: int, size: int) -> Any:
        """reasoning-gym's ``CompositeDataset`` of this mix (``size`` entries from ``seed``)."""
        from reasoning_gym.composite import CompositeConfig, CompositeDataset, DatasetSpec

        specs = [DatasetSpec(d.name, d.weight, dict(d.config)) for d in self.datasets]
        return CompositeDataset(CompositeConfig(size=size, seed=seed, datasets=specs))

    def example(self, entry: Mapping[str, Any]) -> dict[str, Any]:
        """Our example dict for a reasoning-gym entry (see the module docstring)."""
        name = entry["metadata"]["source_dataset"]
        choice = next(d for d in self.datasets if d.name == name)
        answer = entry.get("answer")
        inst = self.instruction
        ex: dict[str, Any] = {
            "prompt": f"{inst}\n\n{entry['question']}" if inst else str(entry["question"]),
            "answer": "" if answer is None else str(answer),
            "rg_dataset": name,
            "rg_entry": dict(entry),
            "rg_config": choice.config_json,
        }
        if isinstance(answer, str):
            ex["solution"] = f"<answer>{answer}</answer>"
            expr = entry["metadata"].get("expression")
            if (self.calc_rate > 0 and isinstance(expr, str) and _INT.fullmatch(answer)
                    and _unit_hash("rg-calc", str(entry["question"])) < self.calc_rate):
                ex["solution"] = [f"<calc>{expr}</calc>", f"={answer}\n",
                                  f"<answer>{answer}</answer>"]
        return ex


def _did_you_mean(word: str, known: Sequence[str]) -> str:
    match = difflib.get_close_matches(word, list(known), n=1, cutoff=0.6)
    return f" (did you mean {match[0]!r}?)" if match else ""


def _dataset_items(raw: Any) -> list[tuple[str, Any]]:
    """``(name, settings)`` pairs from the mapping form or reasoning-gym's list form."""
    where = f"{KEY}.datasets"
    if isinstance(raw, Mapping):
        return [(str(k), v) for k, v in raw.items()]
    if isinstance(raw, list | tuple):
        out = []
        for i, spec in enumerate(raw):
            if not isinstance(spec, Mapping) or "name" not in spec:
                raise ConfigError(f"{where}[{i}]: expected a mapping with 'name' (and 'weight', "
                                  f"'config'), got {spec!r}")
            extra = sorted(set(spec) - {"name", "weight", "config"})
            if extra:
                raise ConfigError(f"{where}[{i}]: unknown key {extra[0]!r}; a list item has "
                                  "name, weight, config")
            config = spec.get("config") or {}
            if not isinstance(config, Mapping):
                raise ConfigError(f"{where}[{i}].config: expected a mapping, got {config!r}")
            out.append((str(spec["name"]), {"weight": spec.get("weight", 1.0), **config}))
        return out
    raise ConfigError(f"{where}: expected a mapping of dataset name -> settings, e.g. "
                      f"{{chain_sum: {{weight: 1, min_terms: 2}}}}, got {raw!r}")


def _dataset_choice(name: str, settings: Any) -> DatasetChoice:
    """Validates one dataset's name and settings against reasoning-gym's own config class."""
    from reasoning_gym import create_dataset
    from reasoning_gym.factory import DATASETS

    where = f"{KEY}.datasets"
    known = sorted(n for n in DATASETS if n != "composite")
    if name not in known:
        raise ConfigError(f"{where}: unknown reasoning-gym dataset {name!r}"
                          f"{_did_you_mean(name, known)}; see reasoning_gym.factory.DATASETS")
    where = f"{where}.{name}"
    settings = {} if settings is None else settings
    if not isinstance(settings, Mapping):
        raise ConfigError(f"{where}: expected a mapping of settings (weight and generator "
                          f"options), got {settings!r}")
    settings = dict(settings)
    weight = settings.pop("weight", 1.0)
    if isinstance(weight, bool) or not isinstance(weight, int | float) or not (
            0 < weight < float("inf")):
        raise ConfigError(f"{where}.weight: must be a finite number > 0, got {weight!r}")
    fields = [f.name for f in dataclasses.fields(DATASETS[name][1])]
    for key in settings:
        if key in _MANAGED:
            raise ConfigError(f"{where}.{key}: set by the task (train seeds from run.seed, "
                              "held-out from a fixed seed; sizes from the split)")
        if key not in fields:
            known_keys = [f"{where}.{f}" for f in ["weight", *fields] if f not in _MANAGED]
            raise ConfigError(unknown_key(f"{where}.{key}", known_keys))
    try:
        create_dataset(name, **settings, seed=0, size=1)[0]
    except Exception as exc:  # reasoning-gym validates with assert / raises on bad values
        msg = " ".join(str(exc).split()) or type(exc).__name__
        raise ConfigError(f"{where}: reasoning-gym rejects these settings: {msg}") from None
    return DatasetChoice(name, float(weight), settings)


def parse_options(options: Mapping[str, Any]) -> ReasoningGymOptions:
    """Validated options; a one-line :class:`ConfigError` naming ``data.task_options...``."""
    import importlib.util

    if importlib.util.find_spec("reasoning_gym") is None:
        raise ConfigError("data.task=reasoning_gym needs the reasoning-gym package: pip install "
                          "'sagc-jax[real]' (or reasoning-gym==0.1.25)")
    from reasoning_gym.utils import SYSTEM_PROMPTS

    allowed = ("datasets", "system_prompt", "extra_instruction", "calc_rate")
    for key in options:
        if key not in allowed:
            raise ConfigError(unknown_key(f"{KEY}.{key}", [f"{KEY}.{k}" for k in allowed]))
    if not options.get("datasets"):
        raise ConfigError(f"{KEY}.datasets: required for data.task=reasoning_gym, e.g. "
                          "{chain_sum: {weight: 1, min_terms: 2, max_terms: 3}}")
    choices = tuple(_dataset_choice(n, s) for n, s in _dataset_items(options["datasets"]))
    names = [c.name for c in choices]
    if len(set(names)) != len(names):
        raise ConfigError(f"{KEY}.datasets: a dataset is listed twice ({names})")
    prompt = options.get("system_prompt", "default")
    if prompt is not None and prompt not in SYSTEM_PROMPTS:
        raise ConfigError(f"{KEY}.system_prompt: unknown {prompt!r}"
                          f"{_did_you_mean(str(prompt), sorted(SYSTEM_PROMPTS))}; one of "
                          f"{', '.join(sorted(SYSTEM_PROMPTS))} or null")
    extra = options.get("extra_instruction")
    if extra is not None and (not isinstance(extra, str) or not extra.strip()):
        raise ConfigError(f"{KEY}.extra_instruction: expected non-empty text or null, got "
                          f"{extra!r}")
    rate = options.get("calc_rate", 0.0)
    if isinstance(rate, bool) or not isinstance(rate, int | float) or not 0 <= rate <= 1:
        raise ConfigError(f"{KEY}.calc_rate: expected a number in [0, 1], got {rate!r}")
    return ReasoningGymOptions(choices, prompt, extra, float(rate))


def _train_seed(seed: int, draw: int) -> int:
    """reasoning-gym seed of training draw ``draw`` for run seed ``seed`` (31-bit)."""
    digest = hashlib.blake2b(f"rg-train:{int(seed)}:{draw}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & 0x7FFFFFFF


def heldout_examples(options: ReasoningGymOptions, n: int) -> list[dict[str, Any]]:
    """The first ``n`` held-out examples of the stream seeded ``HELDOUT_SEED``."""
    if n <= 0:
        return []
    cap = 16 * n + 256  # draws; about n * HELDOUT_BUCKETS are needed
    ds = options.composite(HELDOUT_SEED, cap)
    out: list[dict[str, Any]] = []
    for i in range(cap):
        entry = ds[i]
        if question_split(entry["question"]) == "eval":
            out.append(options.example(entry))
            if len(out) == n:
                return out
    raise ConfigError(f"{KEY}.datasets: only {len(out)} of {n} held-out problems in {cap} draws "
                      "(the generators have too few distinct questions); widen their settings "
                      "or lower data.num_eval")


class ReasoningGymSource(LazySource):
    """Lazy random-access training examples (grain ``RandomAccessDataSource`` protocol).

    ``src[i]`` is entry ``i`` of the composite seeded ``_train_seed(seed, draw)`` for the first
    ``draw`` whose question is not held-out. Composites are built on first use and kept.
    """

    def __init__(self, n: int, seed: int, options: ReasoningGymOptions) -> None:
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        self._n, self._seed, self._options = int(n), int(seed), options  # _build reads _n
        self._draws: dict[int, Any] = {}
        super().__init__(self._build, n)

    def _composite(self, draw: int) -> Any:
        if draw not in self._draws:
            self._draws[draw] = self._options.composite(_train_seed(self._seed, draw), self._n)
        return self._draws[draw]

    def _build(self, index: int) -> dict[str, Any]:
        for draw in range(_MAX_DRAWS):
            entry = self._composite(draw)[index]
            if question_split(entry["question"]) == "train":
                return self._options.example(entry)
        raise ConfigError(f"{KEY}.datasets: {_MAX_DRAWS} draws for training example {index} "
                          "were all held-out questions (too few distinct questions)")

    def longest_prompts(self) -> list[str]:
        """The 8 longest prompts (characters) of the first 512 examples: a sample, not a
        bound — generators have no cheap worst case (see `data.lengths`)."""
        prompts = [self._example(i)["prompt"] for i in range(min(self._n, _LENGTH_SAMPLE))]
        return sorted(prompts, key=len)[-8:]

    def __repr__(self) -> str:
        return (f"ReasoningGymSource(n={self._n}, seed={self._seed}, "
                f"{self._options.description()})")


def reasoning_gym_task(**options: Any) -> Task:
    """The ``reasoning_gym`` built-in task for ``data.task_options`` (validated here)."""
    opts = parse_options(options)
    return Task(
        name="reasoning_gym",
        default_reward="reasoning_gym",
        description=opts.description(),
        make_train=lambda seed, n: ReasoningGymSource(n, seed, opts),
        make_eval=lambda n: heldout_examples(opts, n),
    )
