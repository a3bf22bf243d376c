"""The CodeAct REPL's child process: ``python -I envs/codeact/child.py LIMITS_JSON``.

Standard library only, and run as a file (its folder's ``apps`` and ``tasks`` imported by
path), so a sandbox starts in a few tens of milliseconds without importing jaxdm or numpy.
What it enforces is described in ``jaxdm.envs.codeact.sandbox``.
"""
from __future__ import annotations

import ast
import io
import json
import os
import sys
import traceback
from typing import Any

__all__ = ["ALLOWED_IMPORTS", "check_code", "serve"]

ALLOWED_IMPORTS = ("math", "json", "re", "datetime", "collections", "itertools", "functools",
                   "statistics", "string")
_SAFE_BUILTINS = ("abs", "all", "any", "bool", "dict", "enumerate", "filter", "float",
                  "format", "int", "isinstance", "len", "list", "map", "max", "min", "print",
                  "range", "repr", "reversed", "round", "set", "sorted", "str", "sum", "tuple",
                  "zip", "Exception", "ValueError", "KeyError", "IndexError", "TypeError",
                  "True", "False", "None")


def check_code(code: str) -> None:
    """SyntaxError, or ValueError naming the first underscore name or attribute."""
    tree = ast.parse(code, "<cell>", "exec")
    for node in ast.walk(tree):
        name = (node.id if isinstance(node, ast.Name) else node.attr
                if isinstance(node, ast.Attribute) else node.name
                if isinstance(node, (ast.FunctionDef, ast.ClassDef)) else None)
        if name is not None and name.startswith("_"):
            raise ValueError(f"names starting with '_' are not allowed: {name!r}")
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) \
                else [node.module or ""]
            for m in mods:
                if m.split(".")[0] not in ALLOWED_IMPORTS:
                    raise ValueError(f"import of {m!r} is not allowed; allowed: "
                                     f"{list(ALLOWED_IMPORTS)}")


# ---- child --------------------------------------------------------------------------------
class _CellTimeout(BaseException):
    """Raised in the child by SIGALRM (a BaseException: `except Exception` cannot hide it)."""


def _restricted_import(name, globals=None, locals=None, fromlist=(), level=0):
    if level != 0 or name.split(".")[0] not in ALLOWED_IMPORTS:
        raise ImportError(f"import of {name!r} is not allowed")
    return __import__(name, globals, locals, fromlist, level)


def serve(limits: dict, make_task, validate, ApiCollection, World) -> None:
    """The child's loop over JSON-line requests on stdin (``limits``: ``SandboxLimits``
    fields; the task and app functions are passed in, imported by path)."""
    import builtins
    import resource
    import signal

    for m in ALLOWED_IMPORTS:  # imported now: nothing is read from disk after the limits
        __import__(m)
    proto_in, proto_out = sys.stdin, os.fdopen(os.dup(1), "w")
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.dup2(null, 2)
    mem = limits["memory_mb"] * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    resource.setrlimit(resource.RLIMIT_CPU, (limits["cpu_seconds"], limits["cpu_seconds"] + 1))
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))

    def on_alarm(signum, frame):
        raise _CellTimeout()

    signal.signal(signal.SIGALRM, on_alarm)
    safe = {n: getattr(builtins, n) for n in _SAFE_BUILTINS}
    safe["__import__"] = _restricted_import
    task = world = start = namespace = None
    for line in proto_in:
        msg = json.loads(line)
        op = msg["op"]
        if op == "open":
            task = make_task(msg["seed"], msg["split"], tuple(msg["task_types"]))
            world = World(task.world)
            start = world.snapshot()
            namespace = {"__builtins__": safe, "apis": ApiCollection(world)}
            reply: dict[str, Any] = {"instruction": task.instruction,
                                     "task_type": task.task_type, "menu": list(task.menu)}
        elif op == "exec":
            reply = _run_cell(msg["code"], namespace, limits["cell_timeout"])
        elif op == "completed":
            reply = {"completed": world.data["task"]["status"] == "complete"}
        elif op == "evaluate":
            reply = {"requirements": validate(task, start, world.snapshot())}
        else:
            reply = {"error": f"unknown op {op!r}"}
        proto_out.write(json.dumps(reply) + "\n")
        proto_out.flush()


def _run_cell(code: str, namespace: dict, timeout: float) -> dict:
    import signal

    printed = io.StringIO()
    namespace["__builtins__"]["print"] = lambda *a, **k: print(
        *a, **{**{x: y for x, y in k.items() if x in ("sep", "end")}, "file": printed})
    try:
        check_code(code)
        compiled = compile(code, "<cell>", "exec")
    except (SyntaxError, ValueError) as e:
        return {"output": f"Execution failed. {type(e).__name__}: {e}", "ok": False}
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        exec(compiled, namespace)
        ok, tail = True, ""
    except _CellTimeout:
        ok, tail = False, f"Execution failed. The cell exceeded its {timeout:g} s time limit."
    except MemoryError:
        ok, tail = False, "Execution failed. MemoryError: the cell exceeded the memory limit."
    except Exception as e:
        ok = False
        tb = traceback.extract_tb(e.__traceback__)
        where = [f"  line {f.lineno}" for f in tb if f.filename == "<cell>"][-1:]
        tail = "Execution failed. Traceback:\n" + "\n".join(where) + "\n" + f"{type(e).__name__}: {e}"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    out = printed.getvalue()
    out = (out + tail) if tail else (out or "Execution successful.")
    return {"output": out.rstrip("\n"), "ok": ok}


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from apps import ApiCollection, World  # noqa: E402 (imported by path in the child)
    from tasks import make_task, validate  # noqa: E402

    serve(json.loads(sys.argv[1]), make_task, validate, ApiCollection, World)
