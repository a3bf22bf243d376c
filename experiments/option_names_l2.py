"""L2 tool accuracy with option likelihood over full option texts vs over option names.

Issue 38's rendering lever: a DECISION GYM tool question lists the 69 tools with their
descriptions, and option likelihood then scored each full ``name: description`` again as the
reply (~3,000 tokens, 1,170 answer slots). With ``MultipleChoice.option_names`` the reply
scored is the tool's name (~2,200 tokens, 373 slots). This script asks the same bench L2
questions (``jaxdm.bench.run``'s L2 set: the same tasks, states and seed) both ways, for each
model given, and writes per-kind accuracy with Wilson intervals and the exact McNemar test of
each pair (``bench_compare.summary``). Parameter and stop questions have no names, so both
renderings ask them the same way (bf16 packing may still flip a near-tie).

    python experiments/option_names_l2.py --out runs/option_names_l2 \\
        --model smollm2 --model trained=runs/dm_gym/run/model --dtype bfloat16
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import subprocess
import time
from pathlib import Path

import numpy as np


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", action="append", required=True,
                    help="NAME=PATH or PATH (smollm2: the packaged model); repeatable")
    ap.add_argument("--test-tasks", type=int, default=30, help="L2 tasks (the recipe's bench)")
    ap.add_argument("--test-states", type=int, default=30, help="L2 states (the recipe's bench)")
    ap.add_argument("--l1", type=int, default=0,
                    help="also this many bench L1 tool items (BFCL functions; 0: none)")
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    ap.add_argument("--overwrite", action="store_true")
    args = ap.parse_args(argv)
    if args.test_tasks < 1 or args.test_states < 1:
        ap.error("--test-tasks and --test-states must be >= 1")
    from jaxdm.rundir import refuse_overwrite
    try:
        refuse_overwrite([Path(args.out) / "results.json"], overwrite=args.overwrite)
    except FileExistsError as e:
        ap.error(str(e))
    return args


def renderings(questions: list) -> dict[str, list]:
    """"full": every option's whole text is the scored reply (names stripped); "names": the
    questions as built (tool questions score the tool's name)."""
    return {"full": [dataclasses.replace(q, option_names=None) for q in questions],
            "names": questions}


def ask(backend, questions: list, name: str, batch: int = 8) -> list[dict]:
    """One bench-shaped record per question (``bench_compare``'s fields)."""
    out = []
    for i in range(0, len(questions), batch):
        part = questions[i:i + batch]
        for q, r in zip(part, backend.choose(part)):
            pick = int(np.argmax(r.probs))
            out.append({"backend": name, "kind": q.meta["kind"], "n_options": len(q.options),
                        "answer": list(q.meta["answer"]), "choice": pick,
                        "correct": pick in q.meta["answer"], "failed": False,
                        "tokens_in": r.cost.tokens_in})
    return out


def main(argv=None) -> dict:
    args = parse_args(argv)
    import sys
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_compare import summary

    from jaxdm.bench.l2 import L2Config, build_l2
    from jaxdm.decision.local import LocalLikelihood
    from jaxdm.models.lora import load_model
    from jaxdm.jsonl import write_atomic

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    # The bench's L2 set (jaxdm.bench.run: BenchConfig defaults, seed 0).
    from jaxdm.bench.run import BenchConfig
    bc = BenchConfig(l2_tasks=args.test_tasks, l2_max_states=args.test_states, seed=0)
    questions, stats = build_l2(L2Config(
        tasks=bc.l2_tasks, variant=bc.l2_variant, agent_error_rate=bc.l2_agent_error_rate,
        after_error_share=bc.l2_after_error_share, max_states=bc.l2_max_states, seed=bc.seed))
    if args.l1:
        from jaxdm.bench.l1 import build_l1
        questions += [q for q in build_l1(args.l1, 0, bc.seed)[0] if q.meta["kind"] == "l1_tool"]
    models = [m.split("=", 1) if "=" in m else (Path(m).name or m, m) for m in args.model]
    records, timing = [], {}
    for name, path in models:
        backend = LocalLikelihood(load_model(path, args.dtype))
        for how, qs in renderings(questions).items():
            t0 = time.perf_counter()
            recs = ask(backend, qs, f"{name}/{how}")
            timing[f"{name}/{how}"] = {
                "seconds": time.perf_counter() - t0,
                "tool_tokens_in": sum(r["tokens_in"] for r in recs if r["kind"] == "tool")}
            records += recs
            print(f"{name}/{how}: {sum(r['correct'] for r in recs)}/{len(recs)} right, "
                  f"{timing[f'{name}/{how}']['seconds']:.1f} s", flush=True)
    with open(out / "records.jsonl", "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    by = {}
    for r in records:
        by.setdefault(r["backend"], []).append(r)

    def pairs(a: str, b: str) -> dict:
        got: dict = {}
        for x, y in zip(by[a], by[b]):
            got.setdefault(x["kind"], []).append((bool(x["correct"]), bool(y["correct"]), x))
        return summary(got)

    comparisons = {f"{n}: full vs names": pairs(f"{n}/full", f"{n}/names") for n, _ in models}
    for (n1, _), (n2, _) in zip(models, models[1:]):
        for how in ("full", "names"):
            comparisons[f"{how}: {n1} vs {n2}"] = pairs(f"{n1}/{how}", f"{n2}/{how}")
        # a model trained on full options against one trained on names, each as trained
        comparisons[f"{n1}/full vs {n2}/names"] = pairs(f"{n1}/full", f"{n2}/names")
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    result = {"l2": stats, "dtype": args.dtype, "models": dict(models), "timing": timing,
              "comparisons": comparisons, "machine": platform.machine(),
              "cpu": next((ln.split(":", 1)[1].strip() for ln in lscpu.splitlines()
                           if ln.startswith("Model name")), "?")}
    write_atomic(out / "results.json", json.dumps(result, indent=1))
    lines = ["| comparison (a vs b) | kind | n | a | b | only b / only a | McNemar p |",
             "|---|---|---|---|---|---|---|"]
    for title, rows in comparisons.items():
        for kind, r in rows.items():
            lines.append(f"| {title} | {kind} | {r['n']} | {r['a']:.3f} "
                         f"[{r['a_ci'][0]:.2f}, {r['a_ci'][1]:.2f}] | {r['b']:.3f} "
                         f"[{r['b_ci'][0]:.2f}, {r['b_ci'][1]:.2f}] | {r['only_b']} / "
                         f"{r['only_a']} | {r['mcnemar_p']:.2g} |")
    (out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return result


if __name__ == "__main__":
    main()
