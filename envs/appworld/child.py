"""The AppWorld worker: ``APPWORLD_PYTHON envs/appworld/child.py`` (the appworld venv's python).

Standard library and the official ``appworld`` package only (it cannot share jaxdm's venv:
it pins pydantic<2), so jaxdm is never imported here. One task world per process (AppWorld
freezes the clock and holds its databases per process). JSON lines on stdin/stdout, one reply
per request:

* ``{"op": "task_ids", "dataset": NAME}`` -> ``{"task_ids": [...]}`` (``appworld.load_task_ids``)
* ``{"op": "open", "task_id", "experiment_name", "timeout_seconds", "max_interactions"}`` ->
  ``{"instruction", "supervisor", "datetime"}``: ``AppWorld(task_id=...)``
* ``{"op": "exec", "code"}`` -> ``{"output"}``: ``world.execute(code)``
* ``{"op": "completed"}`` -> ``{"completed"}``: ``world.task_completed()``
* ``{"op": "evaluate"}`` -> ``{"success", "passes", "failures"}``: ``world.evaluate()``

A request that raises gets ``{"error": traceback}``. At EOF the world is closed and its
experiment output folder removed (unless ``JAXDM_APPWORLD_KEEP_OUTPUTS`` is set). Whatever
AppWorld prints goes to stderr: stdout carries only the protocol.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import traceback


def serve() -> None:
    """Answer requests until stdin closes (see module docstring)."""
    proto_out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)   # AppWorld's own prints must not corrupt the protocol
    from appworld import AppWorld, load_task_ids, path_store

    world, outputs = None, None
    try:
        for line in sys.stdin:
            request = json.loads(line)
            try:
                reply = _answer(request, world, AppWorld, load_task_ids)
                if request["op"] == "open":
                    world, reply = reply
                    outputs = os.path.join(path_store.experiment_outputs,
                                           request["experiment_name"])
            except Exception:  # noqa: BLE001 - reported to the parent, which names it
                reply = {"error": traceback.format_exc(limit=6)}
            proto_out.write(json.dumps(reply) + "\n")
            proto_out.flush()
    finally:
        if world is not None:
            world.close()
        if outputs and not os.environ.get("JAXDM_APPWORLD_KEEP_OUTPUTS"):
            shutil.rmtree(outputs, ignore_errors=True)


def _answer(request: dict, world, AppWorld, load_task_ids):
    op = request["op"]
    if op == "task_ids":
        return {"task_ids": list(load_task_ids(request["dataset"]))}
    if op == "open":
        if world is not None:
            raise RuntimeError("this worker already holds a task world")
        world = AppWorld(task_id=request["task_id"], experiment_name=request["experiment_name"],
                         timeout_seconds=request["timeout_seconds"],
                         max_interactions=request["max_interactions"])
        sup = world.task.supervisor
        return world, {"instruction": world.task.instruction,
                       "supervisor": {k: sup[k] for k in ("first_name", "last_name", "email",
                                                          "phone_number") if k in sup},
                       "datetime": str(world.task.datetime)}
    if world is None:
        raise RuntimeError(f"{op!r} before 'open'")
    if op == "exec":
        return {"output": world.execute(request["code"])}
    if op == "completed":
        return {"completed": bool(world.task_completed())}
    if op == "evaluate":
        result = world.evaluate().to_dict()
        return {"success": bool(result["success"]),
                "passes": [p["requirement"] for p in result["passes"]],
                "failures": [f["requirement"] for f in result["failures"]]}
    raise ValueError(f"unknown op {op!r}")


if __name__ == "__main__":
    serve()
