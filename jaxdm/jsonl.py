"""JSON Lines files of long jobs: one reader for trajectories, training data, metrics, screen
and bench stores and harness journals (every bad line gets the same error naming the file and
line number), and the two ways their records are written.

``append_records`` appends whole records, each with its newline, flushed and fsync'd, so the
only damage a crash can leave is a *torn* last line: text without its newline.
``read_records(..., drop_torn_tail=True)`` (resuming a job) drops such a line with a message;
any other line that is not JSON is an error, never skipped. ``write_atomic`` replaces a whole
file (a rewrite never leaves half a file).
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Iterable, Iterator

__all__ = ["parse_lines", "read_records", "append_records", "write_records", "write_atomic"]


def parse_lines(lines: Iterable[str], source: Any) -> Iterator[tuple[str, Any]]:
    """(where, value) of each non-blank line, where = ``f"{source}:{n}"`` (n counts from 1,
    blank lines included). A line that is not JSON raises ValueError
    ``"{source}:{n}: invalid JSON (<parser message> at column c)"``."""
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{source}:{n}"
        try:
            value = json.loads(line.rstrip("\r\n"))  # columns then count on this line
        except json.JSONDecodeError as e:
            raise ValueError(f"{where}: invalid JSON ({e.msg} at column {e.colno})") from None
        yield where, value


def read_records(path: str | Path, *, drop_torn_tail: bool = False) -> list[tuple[str, Any]]:
    """(where, value) of every line of ``path`` (``parse_lines``).

    ``drop_torn_tail``: a last line without its newline that is not JSON (a write cut short)
    is dropped with a message on stderr instead of raising; a bad line anywhere else, or a
    bad last line that has its newline, is still an error."""
    with open(path, encoding="utf-8") as f:
        lines = f.readlines()
    torn = drop_torn_tail and bool(lines) and not lines[-1].endswith("\n")
    records = list(parse_lines(lines[:-1] if torn else lines, path))
    if torn and lines[-1].strip():
        where = f"{path}:{len(lines)}"
        try:
            records.append((where, json.loads(lines[-1])))
        except json.JSONDecodeError as e:
            print(f"{where}: dropping a torn last line ({e.msg}; {len(lines[-1])} bytes): the "
                  f"job stopped while writing it", file=sys.stderr, flush=True)
    return records


def append_records(path: str | Path, records: Iterable[Any]) -> None:
    """Appends one JSON line per record, then flushes and fsyncs (finished work survives a
    crash right after)."""
    with open(path, "a", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())


def write_records(path: str | Path, records: Iterable[Any]) -> int:
    """Replaces ``path`` with one JSON line per record, whole (``write_atomic``); returns the
    count."""
    lines = [json.dumps(record) + "\n" for record in records]
    write_atomic(path, "".join(lines))
    return len(lines)


def write_atomic(path: str | Path, text: str) -> None:
    """Replaces ``path`` with ``text`` whole (a temporary file fsync'd, then renamed)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
