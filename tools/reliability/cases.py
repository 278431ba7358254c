"""The record a case-by-case harness returns (model files, task options, changed-config resumes)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class Result:
    """Cases tried, outcome counts, the failing cases and one record per case."""

    tried: int = 0
    outcomes: Counter = field(default_factory=Counter)
    failures: list = field(default_factory=list)
    records: list = field(default_factory=list)
