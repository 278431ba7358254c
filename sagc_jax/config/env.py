"""The ``env:`` section: multi-turn, tool-using rollouts (docs/environments.md).

Absent (null), every rollout is one completion per row, as before. Set, each row is an episode:
the model's turns alternate with the environment's replies (`sagc_jax.envs`), the replies are
context the loss never scores, and the episode's reward is the `rewards:` on its text plus the
environment's return (`reward`: the final step's or the sum, times `reward_weight`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, model_validator

from sagc_jax.config.base import Float, Int, Section, Str, field, rule_error


class _FrozenOptions(dict):
    """A dict that hashes by its sorted items' repr, so the section stays hashable."""

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(repr(sorted(self.items())))


def _frozen(value: dict[str, Any]) -> dict[str, Any]:
    return _FrozenOptions(value)


class EnvConfig(Section):
    """The environment each rollout row plays an episode against."""

    section_key = "env"
    name: Str = field(doc="Built-in environment (calculator) or 'package.module:Class'.")
    options: Annotated[dict[Str, Any], AfterValidator(_frozen)] | None = field(
        None, "Keyword arguments of the environment's constructor (one instance per episode).")
    max_turns: Int = field(
        4, "Model turns per episode at most (a turn ends at a stop string or EOS); the episode "
        "ends after this many even if the environment would go on.", ge=1)
    stop: tuple[Str, ...] | None = field(
        None, "Strings that end a model turn besides EOS, matched as their token ids (the "
        "tokenizer's encoding of the string); None = the environment's own `stop`.")
    max_reply_tokens: Int = field(
        16, "Tokens one environment reply may take (the compiled width of the reply buffer); "
        "a longer reply is an error naming the env.", ge=1)
    timeout_s: Float | None = field(
        None, "Seconds one environment call (constructor, reset, step) may take; a call that "
        "takes longer fails the step with one line naming the env. None = wait forever.", gt=0)
    reward: Literal["final", "sum"] = field(
        "final", "The environment's return: the reward of its final step (TRL's convention) or "
        "the sum over the episode's steps.")
    reward_weight: Float = field(
        1.0, "Weight of the environment's return, added to the rewards: total.")

    @model_validator(mode="after")
    def _rules(self) -> EnvConfig:
        if not self.name.strip():
            raise rule_error("name", "must be a non-empty string")
        if self.stop is not None and not all(self.stop):
            raise rule_error("stop", f"must not hold an empty string, got {list(self.stop)}")
        return self
