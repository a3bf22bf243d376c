"""``python kill_after.py SUFFIX K SCRIPT args...``: runs the experiment script SCRIPT (as
``python SCRIPT args...`` would) and SIGKILLs its own process right after the K-th completed
write of a file whose path ends with SUFFIX (e.g. ``grpo/seed_0/metrics.jsonl``). Counted
writes: every whole-file write and append of ``jaxdm.jsonl`` (``write_atomic``, which
``write_json`` / ``write_records`` / ``config.dump_yaml`` use, and ``append_records``) and
every metrics line of ``jaxdm.runlog.MetricsWriter`` (the trainers' ``metrics.jsonl``). A kill
leaves what a power cut would: nothing runs after it, no ``finally``, no handler. Exits with
the script's own code when the write never happens, so a test can tell a kill point that
does not exist. JAX's persistent compilation cache is on (``jaxdm.models.compile_cache``, as
the ``jaxdm`` command has it), so the many processes of one test compile each program once."""
from __future__ import annotations

import os
import runpy
import signal
import sys
from pathlib import Path

from jaxdm import jsonl  # before anything imports its writers by name

SUFFIX, K = sys.argv[1], int(sys.argv[2])
_seen = 0


def _count(path) -> None:
    global _seen
    if Path(path).as_posix().endswith(SUFFIX):
        _seen += 1
        if _seen == K:
            os.kill(os.getpid(), signal.SIGKILL)


def _counted(write):
    def wrapped(path, *args, **kwargs):
        result = write(path, *args, **kwargs)
        _count(path)
        return result
    return wrapped


jsonl.write_atomic = _counted(jsonl.write_atomic)
jsonl.append_records = _counted(jsonl.append_records)

from jaxdm import runlog  # noqa: E402  (after the patch: runlog imports jsonl's writers)

_metrics_write = runlog.MetricsWriter.write


def _metrics_counted(self, step, metrics):
    record = _metrics_write(self, step, metrics)
    _count(self.path)
    return record


runlog.MetricsWriter.write = _metrics_counted

if __name__ == "__main__":
    from jaxdm.models import compile_cache

    compile_cache.enable()
    script = Path(sys.argv[3]).resolve()
    sys.argv = [str(script), *sys.argv[4:]]
    sys.path.insert(0, str(script.parent))   # as `python SCRIPT` puts the script's folder first
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as e:
        sys.exit(e.code)
