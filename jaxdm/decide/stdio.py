"""`jaxdm decide --stdio`: one JSON answer or error line per input line, in input order.

The reader never dies on a line: bad UTF-8, bad or non-strict JSON, nesting or integers
beyond the limits, a line over ``max_body_bytes`` and any other failure of one line give that
line an error line (``"line"``: its number) and reading goes on. ``serve_stdio`` returns the
exit code: 0 when every line was answered, 1 when some line got an error line, 2 when reading
the input itself failed (an error line says so).
"""
from __future__ import annotations

import io
import queue
import sys
import threading
import time
from typing import BinaryIO, Iterable, TextIO

from jaxdm.decide.answers import collect, submit
from jaxdm.decide.protocol import Limits, RequestError, decode_body, encode_json
from jaxdm.decide.scheduler import MicroBatcher

_STDIO_CLIENT = "stdio"


def _lines(source: BinaryIO | Iterable, limit: int) -> Iterable[bytes | str | None]:
    """Lines of a binary stream, each at most ``limit`` bytes (None for a longer one, whose
    rest is skipped), or the items of an iterable as they are."""
    if not isinstance(source, (io.BufferedIOBase, io.RawIOBase)):
        yield from source
        return
    readline = source.readline
    while True:
        line = readline(limit + 1)
        if not line:
            return
        if len(line) > limit and not line.endswith(b"\n"):
            while line and not line.endswith(b"\n"):
                line = readline(1 << 20)
            yield None
            continue
        yield line


def serve_stdio(batcher: MicroBatcher, model: str, lines: BinaryIO | Iterable, out: TextIO,
                timeout: float = 300.0, limits: Limits = Limits()) -> int:
    """Answers each non-blank line of ``lines`` (a binary stream, or an iterable of str /
    bytes lines) on ``out``; returns the exit code (module docstring). A reader thread submits
    each line as soon as it is read, so lines piped together are micro-batched like concurrent
    HTTP requests."""
    pending: queue.Queue = queue.Queue()
    read_failed: list[str] = []

    def reader() -> None:
        lineno = 0
        try:
            for line in _lines(lines, limits.max_body_bytes):
                lineno += 1
                t0 = time.perf_counter()
                try:
                    if line is None:
                        raise RequestError("body", f"line longer than {limits.max_body_bytes} "
                                                   "bytes (--max-body-bytes)")
                    if not (line.strip() if isinstance(line, (str, bytes)) else line):
                        continue
                    parsed = submit(batcher, decode_body(line), limits, _STDIO_CLIENT)
                except RequestError as e:
                    pending.put((lineno, t0, e))
                    continue
                except Exception as e:  # noqa: BLE001 - one line's failure, never the reader's
                    pending.put((lineno, t0, RequestError("body", f"{type(e).__name__}: {e}")))
                    continue
                pending.put((lineno, t0, parsed))
        except Exception as e:  # noqa: BLE001 - the input itself failed: say so, exit 2
            read_failed.append(f"reading line {lineno + 1} failed: {type(e).__name__}: {e}")
        finally:
            pending.put(None)

    threading.Thread(target=reader, name="jaxdm-decide-stdin", daemon=True).start()
    any_error = False
    while (item := pending.get()) is not None:
        lineno, t0, parsed = item
        if isinstance(parsed, RequestError):
            obj = parsed.to_json()
            obj["error"]["line"] = lineno
            any_error = True
        else:
            reqs, is_batch, futures = parsed
            obj, status = collect(reqs, is_batch, futures, model, t0, timeout)
            any_error |= status != 200 or any("error" in r for r in obj.get("results", ()))
        out.write(encode_json(obj).decode() + "\n")
        out.flush()
    if read_failed:
        out.write(encode_json({"error": {"field": None, "message": read_failed[0]}}).decode()
                  + "\n")
        out.flush()
        print(f"jaxdm decide: error: {read_failed[0]}", file=sys.stderr)
        return 2
    return 1 if any_error else 0
