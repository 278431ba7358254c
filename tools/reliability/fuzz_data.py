"""Dataset fuzzing: JSONL / JSON-array / Parquet files with one mutated row (or a mutated whole
file) through the trainer's own reading and prompt-length checks.

Every case must load (each row then holds exactly what was written: a documented skip is only a
blank JSONL line) or raise `DataError` with one line that names the file and, for a row-level
mutation, that row (``line <n>`` for JSONL, ``row <i>`` for Parquet, ``item <i>`` for a JSON
array, ``example <i>`` for the length check). Anything else is a failure.
"""

from __future__ import annotations

import json
import os
import random
import re
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from sagc_jax.data.lengths import check_prompt_lengths
from sagc_jax.data.readers import DataError, read_examples

MAX_LEN = 64  # tokens: the largest prompt bucket of the check
ROWS = 5
_MISSING = object()

# Row mutations: (name, function row -> row or raw bytes of the line).
_VALUES = [None, 0, -1, 1.5, float("nan"), True, [], ["a"], {}, {"a": 1}, "", "x", 10**20]


def _set(row: dict, key: str, value: Any) -> dict:
    out = dict(row)
    if value is _MISSING:
        out.pop(key, None)
    else:
        out[key] = value
    return out


def row_mutation(rng: random.Random, row: dict) -> tuple[str, Any]:
    """(kind, mutated row as a dict — or bytes: the raw JSONL line)."""
    r = rng.randrange(14)
    if r == 0:
        return "missing_column", _set(row, rng.choice(["prompt", "answer"]), _MISSING)
    if r == 1:
        return "prompt_type", _set(row, "prompt", rng.choice(_VALUES))
    if r == 2:
        return "answer_type", _set(row, "answer", rng.choice(_VALUES))
    if r == 3:
        n = rng.choice([MAX_LEN + 1, 1000, 20_000])
        return "huge_prompt", _set(row, "prompt", "7" * n)
    if r == 4:
        line = json.dumps(row).encode()
        i = rng.randrange(len(line))
        return "non_utf8", line[:i] + bytes([rng.choice([0x80, 0xC3, 0xFF, 0xED])]) + line[i:]
    if r == 5:
        line = json.dumps(row).encode()
        return "bad_json", line[: rng.randrange(1, len(line))]
    if r == 6:
        return "not_an_object", rng.choice([[1, 2], 3, "text", None, True])
    if r == 7:
        return "odd_text", _set(row, "prompt", rng.choice(["\u0000", "\ud800x", "é" * 20,
                                                             "\r\n", "\t", "😀" * 10, " "]))
    if r == 8:
        return "extra_columns", _set(row, rng.choice(["extra", "meta", "", "prompt_ids"]),
                                     rng.choice(_VALUES))
    if r == 9:
        return "deep_json", b'{"prompt": ' + b"[" * 20_000 + b"]" * 20_000 + b"}"
    if r == 10:
        return "huge_number", ('{"prompt": "1+1=", "answer": ' + "9" * 5000 + "}").encode()
    if r == 11:
        return "blank_line", rng.choice([b"", b"   ", b"\t"])
    if r == 12:
        return "json_literals", rng.choice([b'{"prompt": "a", "answer": NaN}',
                                             b'{"prompt": "a", "answer": Infinity}',
                                             b'{"prompt": "a", "prompt": "b", "answer": 1}'])
    return "valid", dict(row)


def _rows(rng: random.Random) -> list[dict]:
    return [{"prompt": f"{rng.randrange(100)}+{rng.randrange(100)}=",
             "answer": rng.choice([str(rng.randrange(200)), rng.randrange(200)])}
            for _ in range(ROWS)]


def _write_jsonl(path: str, rows: list[Any], crlf: bool) -> None:
    end = b"\r\n" if crlf else b"\n"
    with open(path, "wb") as fh:
        for r in rows:
            fh.write((r if isinstance(r, bytes) else json.dumps(r).encode("utf-8", "surrogatepass"))
                     + end)


def _write_parquet(path: str, rows: list[Any]) -> list[dict]:
    """Writes `rows` as a Parquet table; returns the rows as stored (Parquet columns are typed:
    a row lacking a column holds null, a mixed-type column is stored as text)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    cols: dict[str, list[Any]] = {}
    keys = sorted({k for r in rows if isinstance(r, dict) for k in r})
    for k in keys:
        cols[k] = [r.get(k) if isinstance(r, dict) else None for r in rows]
    try:
        table = pa.table(cols)
        pq.write_table(table, path)
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        # Mixed types in a column: Parquet columns are typed, so store that column as text.
        # (lone surrogates cannot be stored in Parquet at all: written as U+FFFD)
        table = pa.table({k: [None if v is None else str(v).encode("utf-8", "replace").decode()
                              for v in vs] for k, vs in cols.items()})
        pq.write_table(table, path)
    return table.to_pylist()


@dataclass
class DataFuzzResult:
    """Counts of a data fuzz run; `failures` holds (case index, description, problem)."""

    tried: int = 0
    rows: int = 0
    outcomes: Counter = field(default_factory=Counter)
    failures: list[tuple[int, str, str]] = field(default_factory=list)


def _loc_pattern(fmt: str, i: int) -> str:
    """Location words a message must contain for mutated row `i` (0-based)."""
    if fmt == "jsonl":
        return rf"line {i + 1}\b|example {i}\b"
    if fmt == "parquet":
        return rf"row {i}\b|example {i}\b|{_PARQUET_FILE_LEVEL}"
    return rf"item {i}\b|line \d+ column|example {i}\b"  # a JSON array: item, or text position


# Parquet columns are typed: a wrong-typed or missing value in one row can fail the whole
# column (naming the column, not a row) — that is still one line naming the file.
_PARQUET_FILE_LEVEL = r"missing (prompt|answer) column|cannot read Parquet"


def check_case(path: str, fmt: str, written: list[Any], mutated: int | None, tok: Any) -> str:
    """Load `path` as the trainer does; returns the outcome kind or raises AssertionError."""
    try:
        rows = read_examples(path)
        check_prompt_lengths(rows, tok, max_len=MAX_LEN, where=f"data.train_file {path}")
    except DataError as e:
        msg = str(e)
        assert "\n" not in msg and path in msg, f"not one line naming the file: {msg!r:.300}"
        if mutated is not None:
            assert re.search(_loc_pattern(fmt, mutated), msg), \
                f"does not name the mutated row {mutated}: {msg!r:.300}"
        return "error"
    except Exception as e:  # what we look for
        raise AssertionError(f"{type(e).__name__}: {e!s:.300}") from e
    if mutated is None:  # whole-file damage that still parses (cut at a line end): fine
        return "loaded"
    # Loaded: every non-blank row is there with its prompt unchanged (no silent damage).
    expect = [r for r in written if not (isinstance(r, bytes) and not r.strip())]
    assert len(rows) == len(expect), f"{len(rows)} rows loaded, {len(expect)} written"
    for got, want in zip(rows, expect, strict=True):
        if isinstance(want, dict):
            assert got["prompt"] == want["prompt"], "a prompt changed on the way in"
    return "loaded"


def run_data_fuzz(n: int, seed: int = 0) -> DataFuzzResult:
    """`n` cases over JSONL, JSON-array and Parquet files (plus whole-file damage)."""
    from sagc_jax.data.tokenizer import load_tokenizer

    tok = load_tokenizer(None)
    rng = random.Random(seed)
    res = DataFuzzResult()
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(n):
            fmt = rng.choice(["jsonl", "jsonl", "json", "parquet"])
            path = os.path.join(tmp, f"case{i}.{fmt}")
            rows: list[Any] = _rows(rng)
            mutated: int | None = rng.randrange(ROWS)
            kind, new = row_mutation(rng, rows[mutated])
            if fmt != "jsonl" and isinstance(new, bytes):
                kind, new = "prompt_type", _set(rows[mutated], "prompt", rng.choice(_VALUES))
            rows[mutated] = new
            if rng.random() < 0.05:  # whole-file damage
                kind, mutated = rng.choice(["empty_file", "garbage_file", "truncated_file"]), None
            try:
                if fmt == "jsonl":
                    _write_jsonl(path, rows, crlf=rng.random() < 0.2)
                elif fmt == "json":
                    with open(path, "w", encoding="utf-8", errors="surrogatepass") as fh:
                        json.dump(rows, fh, indent=rng.choice([None, 1]))
                else:
                    rows = _write_parquet(path, rows)
                if kind == "empty_file":
                    open(path, "wb").close()
                elif kind == "garbage_file":
                    with open(path, "wb") as fh:
                        fh.write(bytes(rng.randrange(256) for _ in range(200)))
                elif kind == "truncated_file":
                    with open(path, "rb") as fh:
                        data = fh.read()
                    with open(path, "wb") as fh:
                        fh.write(data[: rng.randrange(len(data))])
                out = check_case(path, fmt, rows, mutated, tok)
            except AssertionError as e:
                res.failures.append((i, f"{fmt} {kind} row {mutated}", str(e)))
                out = "failure"
            res.tried += 1
            res.rows += 1 if mutated is not None else 0
            res.outcomes[f"{fmt}:{kind}:{out}"] += 1
            os.unlink(path)
    return res
