"""The storage and signal tables of docs/results/reliability.md, from their per-case records:

    python -m tools.reliability.table docs/results/reliability_storage.jsonl
    python -m tools.reliability.table docs/results/reliability_signals.jsonl

prints the Markdown table of one record (storage when its rows have a `kind`, signals when
they have a `phase`). `tests/test_reliability_faults.py` checks the page holds these tables as
printed, so the page's figures are the committed records'.
"""

from __future__ import annotations

import json
import re
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

STORAGE_KINDS = {
    "full-save": "disk full while a step checkpoint is written (0-200 KB left)",
    "full-metrics": "disk full while a metrics row is appended (0-600 bytes left)",
    "full-initial": "disk full while the SFT warm start is saved",
    "small-disk": "a filesystem of 0.1-3 MB from the start",
    "still-full": "disk full at a checkpoint, then a rerun on the still-full disk",
    "ro-start": "read-only filesystem, fresh run",
    "ro-resume": "killed, then resumed on a read-only filesystem",
    "ro-mid": "run dir made read-only while a checkpoint or a row is written",
    "removed": "run dir deleted while a checkpoint or a row is written, or a step runs",
}
PHASES = {
    "build": "building the run", "sft": "SFT warm start", "save_initial": "saving the warm start",
    "compile": "compile warm-up", "eval": "held-out eval", "step": "a GRPO step",
    "save": "a step's checkpoint write",
}


def _count(c: Counter) -> str:
    return ", ".join(f"{k}: {v}" for k, v in sorted(c.items(), key=lambda kv: str(kv[0])))


def _short(line: str) -> str:
    """A last line with the case's own paths and numbers generalised, for the table."""
    line = re.sub(r"/\S*?/case\d+/mnt/run", "<run.dir>", line)
    line = re.sub(r"/\S*?/case\d+/mnt", "<mount>", line)
    line = re.sub(r"/\S*?/case\d+", "<run.dir>", line)
    line = line.removeprefix("sagc-jax train: ")
    return (line[:110] + " …") if len(line) > 110 else line


def storage_table(recs: list[dict[str, Any]]) -> str:
    by: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in recs:
        by[r["kind"]].append(r)
    out = ["| fault | cases | faulted run: exit codes | e.g. its last line | rerun: identical "
           "to the uninterrupted run | failures |", "|---|---|---|---|---|---|"]
    for kind, rows in by.items():
        codes = Counter("killed" if r.get("exit_code") == -9 else r.get("exit_code", "skipped")
                        for r in rows)
        lines = [r["last_line"] for r in rows if r.get("exit_code") not in (0, -9, None)] + [
            r.get("broken_rerun_line", "") for r in rows if r.get("broken_rerun_line")]
        same = sum(bool(r.get("resumed_identical")) for r in rows)
        fails = sum(bool(r["problems"]) for r in rows)
        out.append(f"| {STORAGE_KINDS.get(kind, kind)} | {len(rows)} | {_count(codes)} | "
                   f"`{_short(lines[0]) if lines else '-'}` | {same}/{len(rows)} | "
                   f"**{fails}** |")
    return "\n".join(out)


def signals_table(recs: list[dict[str, Any]]) -> str:
    by: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in recs:
        by[r["phase"]].append(r)
    out = ["| phase | cases | signals | arrived inside the phase | exit codes | rerun: "
           "identical to the uninterrupted run | failures |", "|---|---|---|---|---|---|---|"]
    for phase, rows in by.items():
        sigs = Counter(f"{r['signal']}{' twice' if r['count'] > 1 else ''}" for r in rows)
        inside = sum(bool(r["inside"]) for r in rows)
        codes = Counter(r["exit_code"] for r in rows)
        same = sum(bool(r["resumed_identical"]) for r in rows)
        fails = sum(bool(r["problems"]) for r in rows)
        out.append(f"| {PHASES.get(phase, phase)} | {len(rows)} | {_count(sigs)} | "
                   f"{inside}/{len(rows)} | {_count(codes)} | {same}/{len(rows)} | "
                   f"**{fails}** |")
    return "\n".join(out)


def table(path: str | Path) -> str:
    recs = [json.loads(ln) for ln in Path(path).read_text().splitlines() if ln.strip()]
    return storage_table(recs) if recs and "kind" in recs[0] else signals_table(recs)


if __name__ == "__main__":
    for p in sys.argv[1:]:
        print(table(p))
