"""JSON Lines files of long jobs: one reader for trajectories, training data, metrics, screen
and bench stores and harness journals (every bad line gets the same error naming the file and
line number), and the ways their records and reports are written.

Reading streams: a file is read one line at a time and a line longer than ``MAX_LINE_BYTES``
is an error naming the file and line *before* it is held in memory (a 1 GB file of NULs is
refused after reading one bound's worth, not after reading it whole).

``append_records`` appends whole records, each with its newline, flushed and fsync'd, so the
only damage a crash can leave is a *torn* last line: text without its newline.
``read_records(..., drop_torn_tail=True)`` (resuming a job) drops such a line with a message;
any other line that is not JSON is an error, never skipped. ``write_atomic`` replaces a whole
file (a rewrite never leaves half a file; each writer has its own temporary file, so two
writers never clobber each other's). A write that fails (no space left, a read-only place)
raises ``OutputError`` naming the file and leaves the file as it was.

Everything written here goes through ``jaxdm.secrets.redact``: a URL's credentials never reach
a result file.
"""
from __future__ import annotations

import errno
import json
import os
import sys
from pathlib import Path
from typing import IO, Any, Collection, Iterable, Iterator

from jaxdm.secrets import redact

__all__ = ["parse_lines", "read_records", "iter_records", "append_records", "write_records",
           "write_atomic", "write_json", "OutputError", "MAX_LINE_BYTES", "bounded_lines"]

# The longest line a reader accepts. A record of a long trajectory is ~1 MB; a line beyond
# this is a wrong file, not data.
MAX_LINE_BYTES = 64 * 1024 * 1024


class OutputError(OSError):
    """A result could not be written (message names the file and the reason); the file is
    left as it was before the write."""


def bounded_lines(f: IO, source: Any, max_bytes: int | None = None) -> Iterator[str]:
    """The lines of an open file, each with its newline (the last may lack it), reading at
    most ``max_bytes`` (default ``MAX_LINE_BYTES``) + 1 characters per line: a longer line raises
    ValueError ``"{source}:{n}: line longer than ... characters"`` before it is read further."""
    limit = MAX_LINE_BYTES if max_bytes is None else int(max_bytes)
    n = 0
    while True:
        line = f.readline(limit + 1)
        if not line:
            return
        n += 1
        if len(line) > limit and not (len(line) == limit + 1 and line.endswith("\n")):
            raise ValueError(f"{source}:{n}: line longer than {limit} characters (not a JSON "
                             f"Lines file of records?)")
        yield line


def parse_lines(lines: Iterable[str], source: Any) -> Iterator[tuple[str, Any]]:
    """(where, value) of each non-blank line, where = ``f"{source}:{n}"`` (n counts from 1,
    blank lines included). An open file is read line by line with the length bound of
    ``bounded_lines``. A line that is not JSON raises ValueError
    ``"{source}:{n}: invalid JSON (<parser message> at column c)"``."""
    if hasattr(lines, "readline"):
        lines = bounded_lines(lines, source)
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{source}:{n}"
        try:
            value = json.loads(line.rstrip("\r\n"))  # columns then count on this line
        except json.JSONDecodeError as e:
            raise ValueError(f"{where}: invalid JSON ({e.msg} at column {e.colno})") from None
        yield where, value


def iter_records(path: str | Path, *, drop_torn_tail: bool = False) -> Iterator[tuple[str, Any]]:
    """(where, value) of every line of ``path``, streamed (``parse_lines``).

    ``drop_torn_tail``: a last line without its newline that is not JSON (a write cut short)
    is dropped with a message on stderr instead of raising; a bad line anywhere else, or a
    bad last line that has its newline, is still an error."""
    with open(path, encoding="utf-8") as f:
        lines = bounded_lines(f, path)
        n = 0
        held = next(lines, None)
        while held is not None:
            n += 1
            line, held = held, next(lines, None)
            if not line.strip():
                continue
            where = f"{path}:{n}"
            try:
                yield where, json.loads(line.rstrip("\r\n"))
            except json.JSONDecodeError as e:
                if drop_torn_tail and held is None and not line.endswith("\n"):
                    print(f"{where}: dropping a torn last line ({e.msg}; {len(line)} bytes): "
                          f"the job stopped while writing it", file=sys.stderr, flush=True)
                    return
                raise ValueError(f"{where}: invalid JSON ({e.msg} at column {e.colno})") from None


def read_records(path: str | Path, *, drop_torn_tail: bool = False) -> list[tuple[str, Any]]:
    """All of ``iter_records(path, drop_torn_tail=...)`` as a list."""
    return list(iter_records(path, drop_torn_tail=drop_torn_tail))


def _failed(path: Path, e: OSError) -> OutputError:
    why = "no space left on device" if e.errno == errno.ENOSPC else (e.strerror or str(e))
    out = OutputError(f"cannot write {path}: {why}")
    out.errno = e.errno
    return out


def append_records(path: str | Path, records: Iterable[Any]) -> None:
    """Appends one JSON line per record, then flushes and fsyncs (finished work survives a
    crash right after). A failed write is cut back to the file's size before it (no partial
    line is left) and raises ``OutputError``."""
    path = Path(path)
    text = "".join(redact(json.dumps(record)) + "\n" for record in records)
    if not text:
        path.touch()
        return
    try:
        with open(path, "a", encoding="utf-8") as f:
            start = f.tell()
            try:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            except OSError:
                f.truncate(start)
                raise
    except OSError as e:
        raise _failed(path, e) from e


def write_records(path: str | Path, records: Iterable[Any]) -> int:
    """Replaces ``path`` with one JSON line per record, whole (``write_atomic``); returns the
    count."""
    lines = [json.dumps(record) + "\n" for record in records]
    write_atomic(path, "".join(lines))
    return len(lines)


def write_json(path: str | Path, value: Any, *, indent: int | None = 1, default=None) -> None:
    """Replaces ``path`` with ``value`` as JSON, whole (``write_atomic``)."""
    write_atomic(path, json.dumps(value, indent=indent, default=default) + "\n")


def write_atomic(path: str | Path, text: str) -> None:
    """Replaces ``path`` with ``redact(text)`` whole: a temporary file of this process next to
    it, fsync'd, then renamed over it. A failure (a Ctrl-C too) leaves ``path`` as it was and
    removes the temporary; a failed write raises ``OutputError``."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(redact(text))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        if isinstance(e, OSError):
            raise _failed(path, e) from e
        raise


def without_keys(value: Any, keys: Collection[str]) -> Any:
    """``value`` (JSON-like: dicts, lists, scalars) with every dict entry whose key is in
    ``keys`` removed at any depth; e.g. the timings, to compare two runs' records."""
    if isinstance(value, dict):
        return {k: without_keys(v, keys) for k, v in value.items() if k not in keys}
    if isinstance(value, list):
        return [without_keys(v, keys) for v in value]
    return value
