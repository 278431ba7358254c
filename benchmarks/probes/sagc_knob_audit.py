"""Which test files name each ``sagc:`` field (issue 32's knob audit; a grep, so *named* is not
*tested*). Prints a Markdown table: field | default | test files. The real check is
``tests/test_sagc_fields.py`` (``FIELD_TESTS``: each field's own test; the test of the map fails
when a field is added without one).

Usage: PYTHONPATH=$PWD python benchmarks/probes/sagc_knob_audit.py
"""

from __future__ import annotations

import re
from pathlib import Path

from sagc_jax.config.sagc import SAGCConfig

ROOT = Path(__file__).resolve().parents[2]


def pattern(name: str) -> re.Pattern[str]:
    """``name=``, ``"name"`` / ``'name='``, ``cfg.name`` or ``sagc.name``."""
    n = re.escape(name)
    return re.compile(rf"(?<![\w.]){n}\s*=|[\"']{n}[\"'=]|sagc\.{n}\b|cfg\.{n}\b")


def main() -> None:
    tests = {p.name: p.read_text() for p in sorted((ROOT / "tests").glob("test_*.py"))}
    print("| field | default | tests naming it |")
    print("|---|---|---|")
    for name, f in SAGCConfig.model_fields.items():
        pat = pattern(name)
        hit = [n for n, t in tests.items() if pat.search(t)]
        default = f.get_default(call_default_factory=True)
        print(f"| `{name}` | {default!r} | {', '.join(hit) or '**none**'} |")


if __name__ == "__main__":
    main()
