"""A child process spoken to in JSON lines, one request and one reply at a time.

The transport of the REPL sessions that live in their own process (``jaxdm.envs.codeact``'s
sandbox, ``jaxdm.envs.appworld``'s worker in the appworld venv): the parent writes a request
line to the child's stdin and reads its reply line from stdout within a deadline. A child that
dies, closes its stdout or misses the deadline is killed and ``ChildLost`` is raised, so the
caller can start a new one and replay what took effect.
"""
from __future__ import annotations

import json
import os
import select
import subprocess
import time
from typing import Any, Mapping, Sequence

__all__ = ["ChildLost", "JsonLineChild"]


class ChildLost(RuntimeError):
    """The child died or stopped answering; whatever it held is gone."""


class JsonLineChild:
    """``argv`` started with ``cwd`` and exactly the environment ``env`` (nothing inherited),
    stderr discarded unless ``stderr_path`` names a file to append it to."""

    def __init__(self, argv: Sequence[str], *, cwd: str, env: Mapping[str, str],
                 stderr_path: str | None = None):
        err = open(stderr_path, "ab") if stderr_path else subprocess.DEVNULL
        try:
            self.proc = subprocess.Popen(list(argv), stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=err, cwd=cwd,
                                         env=dict(env))
        finally:
            if stderr_path:
                err.close()
        self._buf = b""

    def call(self, msg: Mapping[str, Any], timeout: float) -> dict:
        """Send ``msg``, return the reply; ``ChildLost`` (child killed) on death or timeout."""
        proc = self.proc
        try:
            proc.stdin.write((json.dumps(msg) + "\n").encode())
            proc.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            self.kill()
            raise ChildLost("the child process is gone") from None
        deadline = time.monotonic() + timeout
        fd = proc.stdout.fileno()
        while b"\n" not in self._buf:
            time_left = deadline - time.monotonic()
            if time_left <= 0 or not select.select([fd], [], [], time_left)[0]:
                self.kill()
                raise ChildLost(f"the child process did not answer within {timeout:g} s")
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                code = proc.wait()
                self.kill()
                raise ChildLost(f"the child process died (exit code {code})")
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return json.loads(line)

    def kill(self) -> None:
        """End the child now (idempotent)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def close(self, timeout: float = 2.0) -> None:
        """Close its stdin (a well-behaved child exits), wait ``timeout`` s, then kill."""
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=timeout)
        except Exception:  # noqa: BLE001 - whatever happened, the child is killed next
            pass
        self.kill()
