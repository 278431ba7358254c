"""Group-size policies of a comparison: `static-<g>`, `sagc` (and `sagc-model` /
`sagc-measured`, SAGC deciding on one clock), and the seeds list."""

from __future__ import annotations

import dataclasses
import re

DEFAULT_POLICIES = "static-4,static-8,static-16,sagc"


@dataclasses.dataclass(frozen=True)
class Policy:
    """A group-size policy: `static-<g>` (fixed G = g) or `sagc` (adaptive). SAGC decides on
    the config's `sagc.timing` clock, or on ``timing`` (`sagc-model`, `sagc-measured`): a
    static run serves both clocks, an adaptive one only the clock it decided on."""

    name: str
    group_size: int | None  # None = SAGC
    timing: str | None = None  # SAGC only: "model" / "measured"; None = the config's

    def overrides(self) -> list[str]:
        """Config overrides that select this policy on top of the base config."""
        if self.group_size is None:
            return ["sagc.enabled=true", *([f"sagc.timing={self.timing}"] if self.timing else [])]
        g = self.group_size
        return ["sagc.enabled=false", f"sagc.initial_group_size={g}", f"sagc.group_sizes=[{g}]"]


def parse_policies(text: str) -> list[Policy]:
    """`"static-4,static-8,sagc"` -> Policies; ValueError naming a bad or repeated entry."""
    out: list[Policy] = []
    for raw in text.split(","):
        name = raw.strip().lower()
        if not name:
            continue
        m = re.fullmatch(r"static-(\d+)", name)
        if m:
            g = int(m.group(1))
            if g < 2:
                raise ValueError(f"policy {raw.strip()!r}: a group needs G >= 2")
            pol = Policy(f"static-{g}", g)
        elif name in ("sagc", "sagc-model", "sagc-measured"):
            pol = Policy(name, None, name.partition("-")[2] or None)
        else:
            raise ValueError(f"unknown policy {raw.strip()!r}: expected static-<G>, sagc, "
                             "sagc-model or sagc-measured")
        if pol in out:
            raise ValueError(f"policy {pol.name!r} listed twice")
        out.append(pol)
    if not out:
        raise ValueError("no policies given")
    return out


def parse_seeds(text: str) -> list[int]:
    """`"0,1"` -> [0, 1]; ValueError on a non-integer or repeated seed."""
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise ValueError(f"--seeds {text!r}: expected comma-separated integers") from None
    if not seeds:
        raise ValueError("no seeds given")
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"--seeds {text!r}: a seed is repeated")
    return seeds


def run_name(policy: Policy, seed: int) -> str:
    return f"{policy.name}-s{seed}"
