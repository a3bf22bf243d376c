"""``python harness_kill_after.py NAME K jaxdm-args...``: runs ``jaxdm jaxdm-args...`` and
SIGKILLs its own process right after the K-th completed write of a file named NAME (every
harness file write goes through ``jaxdm.jsonl``: ``write_atomic``, which ``write_json`` and
``write_records`` use, and ``append_records``). A kill leaves what a power cut would: nothing
runs after it, no ``finally``, no handler. Exits normally (with the command's code) when the
write never happens, so a test can tell a kill point that does not exist."""
from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from jaxdm import jsonl

NAME, K = sys.argv[1], int(sys.argv[2])
_seen = 0


def _counted(write):
    def wrapped(path, *args, **kwargs):
        global _seen
        result = write(path, *args, **kwargs)
        if Path(path).name == NAME:
            _seen += 1
            if _seen == K:
                os.kill(os.getpid(), signal.SIGKILL)
        return result
    return wrapped


jsonl.write_atomic = _counted(jsonl.write_atomic)
jsonl.append_records = _counted(jsonl.append_records)

if __name__ == "__main__":
    from jaxdm.cli import main
    sys.exit(main(sys.argv[3:]))
