"""Dataset readers: JSONL and Parquet files of prompts (+ answers + any extra columns).

Each reader returns a list of dicts with the canonical keys ``prompt`` (str) and ``answer`` (str,
numbers are converted) plus every other column unchanged, so reward functions receive them as
keyword arguments. Any problem raises :class:`DataError` naming the file and the line (JSONL,
1-based), the row index (Parquet, 0-based) or the item index (a ``.json`` file holding one JSON
array of objects, 0-based) and what is wrong.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

#: ``required`` (below): file column -> why the run needs it and the ways out, e.g.
#: ``{"solution": "the SFT warm start needs it (...): set ..."}``.
Required = Mapping[str, str] | None

__all__ = ["DataError", "normalize_row", "read_examples", "read_json_array", "read_jsonl",
           "read_parquet"]


class DataError(ValueError):
    """A dataset file is unreadable, empty or has a malformed row."""


def _check_text(text: str, where: str, what: str) -> None:
    """A JSON ``"\\ud800"`` escape decodes to a lone surrogate, which no tokenizer encodes."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise DataError(f"{where}: {what} is not valid Unicode (lone surrogate "
                        f"U+{ord(text[exc.start]):04X} at character {exc.start})") from None


def normalize_row(
    row: Any,
    *,
    where: str,
    prompt_column: str = "prompt",
    answer_column: str | None = "answer",
    solution_column: str | None = None,
    required: Required = None,
) -> dict[str, Any]:
    """Validate one row and map its prompt/answer/solution columns onto
    ``prompt``/``answer``/``solution``.

    Args:
      row: the decoded row (must be a mapping).
      where: location for error messages, e.g. ``"data.jsonl line 3"``.
      prompt_column: column holding the prompt text (must be a string).
      answer_column: column holding the reference answer (str/int/float, converted to str), or
        ``None`` for datasets without one.
      solution_column: column holding a reference completion (the SFT warm start's target),
        copied to ``solution`` when the row has it.
      required: columns the row must have (not null), each with why: the run's reward functions
        and warm start read them (one line naming the row, the column, who needs it and the
        ways out, rather than a KeyError in step 1).
    """
    if not isinstance(row, Mapping):
        raise DataError(f"{where}: expected a JSON object, got {type(row).__name__}")
    if prompt_column not in row:
        raise DataError(
            f"{where}: missing prompt column {prompt_column!r} (columns: {sorted(row)}; "
            "data.prompt_column names it)"
        )
    prompt = row[prompt_column]
    if not isinstance(prompt, str):
        raise DataError(
            f"{where}: prompt column {prompt_column!r} must be a string, "
            f"got {type(prompt).__name__}"
        )
    _check_text(prompt, where, f"prompt column {prompt_column!r}")
    for col, why in (required or {}).items():
        if row.get(col) is None:
            what = "is null" if col in row else "is missing"
            raise DataError(f"{where}: column {col!r} {what}, and {why} (columns: {sorted(row)})")
    out = {k: v for k, v in row.items() if k not in (prompt_column, answer_column,
                                                       solution_column)}
    out["prompt"] = prompt
    if solution_column is not None and row.get(solution_column) is not None:
        out["solution"] = row[solution_column]
    if answer_column is not None:
        if answer_column not in row:
            raise DataError(
                f"{where}: missing answer column {answer_column!r} (columns: {sorted(row)}; "
                "data.answer_column names it)"
            )
        answer = row[answer_column]
        if isinstance(answer, bool) or not isinstance(answer, str | int | float):
            raise DataError(
                f"{where}: answer column {answer_column!r} must be a string or number, "
                f"got {type(answer).__name__}"
            )
        if isinstance(answer, str):
            _check_text(answer, where, f"answer column {answer_column!r}")
        out["answer"] = answer if isinstance(answer, str) else str(answer)
    return out


def read_jsonl(
    path: str | os.PathLike[str],
    prompt_column: str = "prompt",
    answer_column: str | None = "answer",
    *,
    solution_column: str | None = None,
    required: Required = None,
) -> list[dict[str, Any]]:
    """Read a JSON-lines file (one object per line; blank lines are skipped).

    Raises:
      DataError: unreadable file, bad JSON, non-object row, missing column, non-string prompt
        (message: ``"<file> line <n>: ..."``), or no rows at all.
    """
    path = os.fspath(path)
    rows: list[dict[str, Any]] = []
    try:
        fh = open(path, "rb")  # noqa: SIM115 - closed below; decoded per line to name the line
    except OSError as exc:
        raise DataError(f"{path}: cannot open dataset file: {exc.strerror or exc}") from exc
    with fh:
        for lineno, raw in enumerate(fh, start=1):
            where = f"{path} line {lineno}"
            try:
                line = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
            except UnicodeDecodeError as exc:
                raise DataError(f"{where}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at column "
                                f"{exc.start + 1})") from None
            # Without the line break, an error at the end of the line is reported on this
            # line's last column, not as "line 2 column 1" of the one-line document.
            line = line.rstrip("\r\n")
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"{where}: bad JSON: {exc.msg} (column {exc.colno})") from exc
            except (ValueError, RecursionError) as exc:  # a 5000-digit number, deep nesting
                raise DataError(f"{where}: bad JSON: {_why(exc)}") from None
            rows.append(normalize_row(obj, where=where, prompt_column=prompt_column,
                                      answer_column=answer_column,
                                      solution_column=solution_column, required=required))
    if not rows:
        raise DataError(f"{path}: dataset is empty (no rows)")
    return rows


def _why(exc: BaseException) -> str:
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    return " ".join(str(exc).split())[:200]


def _starts_with_array(path: str) -> bool:
    """Whether the file's first non-blank character is ``[`` (a JSON array, not JSON lines)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(4096)
    except OSError as exc:
        raise DataError(f"{path}: cannot open dataset file: {exc.strerror or exc}") from exc
    return head.lstrip(b"\xef\xbb\xbf \t\r\n").startswith(b"[")


def read_json_array(
    path: str | os.PathLike[str],
    prompt_column: str = "prompt",
    answer_column: str | None = "answer",
    *,
    solution_column: str | None = None,
    required: Required = None,
) -> list[dict[str, Any]]:
    """Read a ``.json`` file holding one JSON array of row objects (the whole file is parsed).

    Raises:
      DataError: unreadable file, not UTF-8, bad JSON (``"<file> line <n> column <c>: ..."``),
        a bad row (``"<file> item <i>: ..."``, 0-based), or an empty array.
    """
    path = os.fspath(path)
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
    except OSError as exc:
        raise DataError(f"{path}: cannot open dataset file: {exc.strerror or exc}") from exc
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise DataError(f"{path} line {line}: not UTF-8 text (byte 0x{raw[exc.start]:02x})"
                        ) from None
    try:
        items = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataError(f"{path} line {exc.lineno} column {exc.colno}: bad JSON: {exc.msg}"
                        ) from None
    except (ValueError, RecursionError) as exc:
        raise DataError(f"{path}: bad JSON: {_why(exc)}") from None
    if not isinstance(items, list):
        raise DataError(f"{path}: expected a JSON array of objects or JSON lines, got "
                        f"{type(items).__name__}")
    if not items:
        raise DataError(f"{path}: dataset is empty (no rows)")
    return [normalize_row(obj, where=f"{path} item {i}", prompt_column=prompt_column,
                          answer_column=answer_column, solution_column=solution_column,
                          required=required) for i, obj in enumerate(items)]


def read_parquet(
    path: str | os.PathLike[str],
    prompt_column: str = "prompt",
    answer_column: str | None = "answer",
    *,
    solution_column: str | None = None,
    required: Required = None,
) -> list[dict[str, Any]]:
    """Read a Parquet file with pyarrow.

    Raises:
      DataError: unreadable file, missing column (names the file and the columns present),
        non-string prompt / bad answer (``"<file> row <i>: ..."``, 0-based), or no rows.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = os.fspath(path)
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException) as exc:
        raise DataError(f"{path}: cannot read Parquet file: {exc}") from exc
    names = table.column_names
    for role, col in (("prompt", prompt_column), ("answer", answer_column)):
        if col is not None and col not in names:
            raise DataError(f"{path}: missing {role} column {col!r} (columns: {sorted(names)}; "
                            f"data.{role}_column names it)")
    for col, why in (required or {}).items():
        if col not in names:
            raise DataError(f"{path}: column {col!r} is missing, and {why} (columns: "
                            f"{sorted(names)})")
    if table.num_rows == 0:
        raise DataError(f"{path}: dataset is empty (no rows)")
    return [
        normalize_row(
            row,
            where=f"{path} row {i}",
            prompt_column=prompt_column,
            answer_column=answer_column,
            solution_column=solution_column,
            required=required,
        )
        for i, row in enumerate(table.to_pylist())
    ]


def read_examples(
    path: str | os.PathLike[str],
    prompt_column: str = "prompt",
    answer_column: str | None = "answer",
    *,
    solution_column: str | None = None,
    required: Required = None,
) -> list[dict[str, Any]]:
    """Read a dataset file, choosing the reader by extension: ``.parquet``/``.pq``; a ``.json``
    file that starts with ``[`` is one JSON array; ``.json``/``.jsonl``/``.ndjson`` JSON lines."""
    p = os.fspath(path)
    kw: dict[str, Any] = {"solution_column": solution_column, "required": required}
    if p.endswith((".parquet", ".pq")):
        return read_parquet(p, prompt_column, answer_column, **kw)
    if p.endswith(".json") and _starts_with_array(p):
        return read_json_array(p, prompt_column, answer_column, **kw)
    if p.endswith((".jsonl", ".json", ".ndjson", ".jsonl.txt")):
        return read_jsonl(p, prompt_column, answer_column, **kw)
    raise DataError(f"{p}: unknown dataset format (expected .jsonl, .json, .ndjson or .parquet)")
