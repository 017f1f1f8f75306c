"""Users' own problem files (`.jsonl`, `.parquet`, a Hugging Face datasets folder written by
`save_to_disk`) as `Problem` lists, and an endless shuffled stream.

Why: real runs train on dumps of GSM8K, MATH or DAPO-Math-17k. A bad row should stop the run
before any process starts, with a message that says which file, which line (or parquet row) and
which field, not crash an actor an hour in.

Shapes accepted per row (an object / a parquet record):
- prompt: a non-empty string, or a chat list `[{"role": "user", "content": "..."}, ...]` (the
  DAPO-Math-17k shape), of which the last user message's content is used.
- answer: a non-empty string or a number (int or float; not a bool), kept as text.
- solution: optional; a string (a golden response, for GCPO) or absent/null.
Field names may be dotted to reach into nested objects, e.g. DAPO-Math-17k:
`load_problems(path, answer_field="reward_model.ground_truth")`.
GSM8K's "answer" holds a worked solution ending in "#### 72": convert it to the bare number first.

`prompt_id` is `"<file stem>:<n>"` with n the 1-based line of a `.jsonl` or the 0-based row of a
`.parquet` or datasets folder, so ids are stable while the file is unchanged. Blank `.jsonl`
lines are skipped. A datasets folder is read with `datasets.load_from_disk` (nothing from the
hub); a DatasetDict's folder is refused with the split folders to name instead.

`iterate_forever(problems, seed, start)` yields item `start`, `start+1`, ... of an endless
sequence of epochs, each a permutation seeded by `(seed, epoch)`: resuming at an index costs one
shuffle, not a replay.
"""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from tasks.arithmetic import Problem


class DatasetError(ValueError):
    """A problem file that cannot be loaded; the message names the file, the line/row and the field."""


_MISSING = object()


def _lookup(row: dict, dotted: str) -> Any:
    value: Any = row
    for key in dotted.split("."):
        if not isinstance(value, dict) or key not in value:
            return _MISSING
        value = value[key]
    return value


def _prompt_text(value: Any) -> str | None:
    """The prompt as text, or None when the value has the wrong shape or is empty."""
    if isinstance(value, str):
        return value if value.strip() else None
    if isinstance(value, list) and value and all(isinstance(m, dict) for m in value):
        users = [m.get("content") for m in value if m.get("role") == "user"]
        if users and isinstance(users[-1], str) and users[-1].strip():
            return users[-1]
    return None


def _answer_text(value: Any) -> str | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, str) and value.strip():
        return value.strip()
    return None


def problem_from_row(
    row: Any, where: str, prompt_id: str, prompt_field: str, answer_field: str, solution_field: str
) -> Problem:
    """One `Problem` from one decoded row; `where` ("file.jsonl line 3") goes into error messages."""
    if not isinstance(row, dict):
        raise DatasetError(f"{where}: expected a JSON object, got {type(row).__name__}")
    fields = {"prompt": prompt_field, "answer": answer_field}
    values = {}
    for role, name in fields.items():
        raw = _lookup(row, name)
        if raw is _MISSING or raw is None:
            raise DatasetError(f"{where}: missing {role} field {name!r}")
        text = _prompt_text(raw) if role == "prompt" else _answer_text(raw)
        if text is None:
            expected = (
                "a non-empty string or a list of chat messages with a user message"
                if role == "prompt"
                else "a non-empty string or a number"
            )
            raise DatasetError(
                f"{where}: field {name!r} ({role}) must be {expected}, got {_show(raw)}"
            )
        values[role] = text
    solution = _lookup(row, solution_field)
    if solution is _MISSING or solution is None:
        solution = None
    elif not isinstance(solution, str):
        raise DatasetError(
            f"{where}: field {solution_field!r} (solution) must be a string, got {_show(solution)}"
        )
    level = row.get("level", 0)  # an integer "level" field gives eval/*/level<N> metrics
    return Problem(prompt_id=prompt_id, question=values["prompt"], answer=values["answer"],
                   level=level if type(level) is int else 0, solution=solution, fields=row)


def _show(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:60]}{'...' if len(text) > 60 else ''}"


def _jsonl_rows(path: Path) -> Iterator[tuple[str, int, Any]]:
    with path.open(encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path} line {line_no}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:  # the row is bad, the scan goes on
                row = DatasetError(f"{where}: not valid JSON ({e.msg})")
            yield where, line_no, row


def _parquet_rows(path: Path) -> Iterator[tuple[str, int, Any]]:
    import pyarrow.parquet as pq  # only parquet users pay for the import

    try:
        table = pq.read_table(path)
    except Exception as e:  # pyarrow raises several types for a corrupt file
        raise DatasetError(f"{path}: not a readable parquet file ({e})") from None
    for row_no, row in enumerate(table.to_pylist()):
        yield f"{path} row {row_no}", row_no, row


def _hf_dataset_rows(path: Path) -> Iterator[tuple[str, int, Any]]:
    """Rows of a folder written by Hugging Face datasets' `save_to_disk` (no hub: read with
    `load_from_disk`). A DatasetDict's folder holds one folder per split: name one."""
    if (path / "dataset_dict.json").is_file():
        splits = sorted(p.name for p in path.iterdir() if (p / "state.json").is_file())
        raise DatasetError(f"{path}: a DatasetDict; name one split's folder: "
                           + ", ".join(str(path / s) for s in splits))
    if not (path / "state.json").is_file():
        raise DatasetError(f"{path}: a folder, but not one written by datasets' save_to_disk "
                           "(no state.json); use a .jsonl or .parquet file or such a folder")
    from datasets import load_from_disk  # only its users pay for the import

    try:
        dataset = load_from_disk(str(path))
    except Exception as e:  # noqa: BLE001 - datasets raises several types for a bad folder
        raise DatasetError(f"{path}: not a readable datasets folder ({e})") from None
    for row_no, row in enumerate(dataset):
        yield f"{path} row {row_no}", row_no, row


def scan_problems(
    path: str | Path,
    prompt_field: str = "prompt",
    answer_field: str = "answer",
    solution_field: str = "solution",
) -> tuple[list[Problem], list[str]]:
    """Every good row's problem and every bad row's message, in file order (`rlvr data check`
    shows them all). A file that cannot be read at all raises `DatasetError`."""
    path = Path(path)
    if path.is_dir():
        rows = _hf_dataset_rows
    else:
        match path.suffix.lower():
            case ".jsonl":
                rows = _jsonl_rows
            case ".parquet":
                rows = _parquet_rows
            case _:
                raise DatasetError(f"{path}: unsupported file type {path.suffix!r} (use .jsonl, "
                                   ".parquet or a datasets save_to_disk folder)")
        if not path.is_file():
            raise DatasetError(f"{path}: no such file")
    problems, bad = [], []
    for where, n, row in rows(path):
        try:
            if isinstance(row, DatasetError):
                raise row
            problems.append(problem_from_row(row, where, f"{path.stem}:{n}", prompt_field,
                                             answer_field, solution_field))
        except DatasetError as e:
            bad.append(str(e))
    return problems, bad


def load_problems(
    path: str | Path,
    prompt_field: str = "prompt",
    answer_field: str = "answer",
    solution_field: str = "solution",
) -> list[Problem]:
    """All problems of a `.jsonl` or `.parquet` file or a datasets folder; a bad row raises `DatasetError` (the
    first one's message, with how many more there are)."""
    problems, bad = scan_problems(path, prompt_field, answer_field, solution_field)
    if bad:
        more = f" (and {len(bad) - 1} more bad rows: rlvr data check lists them)" if bad[1:] else ""
        raise DatasetError(bad[0] + more)
    if not problems:
        raise DatasetError(f"{path}: no problems in file")
    return problems


def _epoch_order(n: int, seed: int, epoch: int) -> list[int]:
    order = list(range(n))
    random.Random(f"{seed}:{epoch}").shuffle(order)
    return order


def iterate_forever(problems: Sequence[Problem], seed: int, start: int = 0) -> Iterator[Problem]:
    """Endless shuffled stream over `problems`, from item `start`; every epoch sees each once."""
    if not problems:
        raise ValueError("iterate_forever needs at least one problem")
    n = len(problems)
    epoch, position = divmod(start, n)
    for epoch in itertools.count(epoch):
        order = _epoch_order(n, seed, epoch)
        for i in order[position:]:
            yield problems[i]
        position = 0
