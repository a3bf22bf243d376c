"""Two decision models on the same AGENT DECISION BENCH questions: accuracy per question kind
with 95 % Wilson intervals, and the exact McNemar test of the paired difference (the
questions both answered; the discordant pairs decide it). Also the majority-answer baseline
per kind, so a model that always gives the commonest answer is visible as such (kinds whose questions all
have the same two or three options).

    python experiments/bench_compare.py runs/dm_gym/bench/l2/records.jsonl \
        --a smollm2-base --b smollm2-sft [--json out.json]

Reads a level's ``records.jsonl`` (one line per question and backend, as ``jaxdm bench``
writes it); failed answers (outages) are left out of both sides of a pair.
"""
from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

from scipy.stats import binomtest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from intervals import wilson_interval  # noqa: E402


def question_key(rec: dict) -> tuple:
    """What identifies a question across backends: its kind, options and answer key, with the
    position among the backend's records of that kind (records keep the bench's order)."""
    return rec["kind"], rec.get("n_options"), tuple(rec.get("answer") or ())


def paired(records: list[dict], a: str, b: str) -> dict[str, list[tuple[bool, bool, dict]]]:
    """kind -> [(a correct, b correct, a's record)] over the questions both answered."""
    by = collections.defaultdict(list)
    for r in records:
        by[r["backend"]].append(r)
    for name in (a, b):
        if name not in by:
            raise SystemExit(f"backend {name!r} not in the records; found {sorted(by)}")
    if len(by[a]) != len(by[b]):
        raise SystemExit(f"{a} has {len(by[a])} records, {b} {len(by[b])}: not the same run")
    out = collections.defaultdict(list)
    for i, (x, y) in enumerate(zip(by[a], by[b])):
        if question_key(x) != question_key(y):
            raise SystemExit(f"record {i}: the two backends' questions differ "
                             f"({question_key(x)} vs {question_key(y)})")
        if x.get("failed") or y.get("failed"):
            continue
        out[x["kind"]].append((bool(x["correct"]), bool(y["correct"]), x))
    return out


def summary(pairs: dict[str, list[tuple[bool, bool, dict]]]) -> dict:
    """Per kind and overall: n, accuracies with Wilson intervals, discordant counts, the exact
    McNemar p-value, and the share of the commonest answer key (the majority baseline)."""
    rows = {}
    for kind, ps in [*sorted(pairs.items()), ("all", [p for v in pairs.values() for p in v])]:
        n = len(ps)
        ka, kb = sum(p[0] for p in ps), sum(p[1] for p in ps)
        only_b = sum(1 for p in ps if p[1] and not p[0])
        only_a = sum(1 for p in ps if p[0] and not p[1])
        p = binomtest(only_b, only_a + only_b, 0.5).pvalue if only_a + only_b else 1.0
        keys = collections.Counter(tuple(q[2].get("answer") or ()) for q in ps)
        # a majority answer means something only where every question has the same few
        # options (stop: continue / finish); a tool index names another tool per question
        fixed = kind != "all" and len({q[2].get("n_options") for q in ps}) == 1 and \
            (ps[0][2].get("n_options") or 99) <= 3
        rows[kind] = {"n": n, "a": ka / n, "a_ci": wilson_interval(ka, n), "b": kb / n,
                      "b_ci": wilson_interval(kb, n), "only_b": only_b, "only_a": only_a,
                      "mcnemar_p": p,
                      "majority": keys.most_common(1)[0][1] / n if fixed else None}
    return rows


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("records")
    ap.add_argument("--a", required=True, help="the reference backend (e.g. before SFT)")
    ap.add_argument("--b", required=True, help="the candidate backend (e.g. after SFT)")
    ap.add_argument("--json", help="also write the table as JSON here")
    args = ap.parse_args(argv)
    records = [json.loads(line) for line in Path(args.records).read_text().splitlines()
               if line.strip()]
    rows = summary(paired(records, args.a, args.b))
    print(f"| kind | n | {args.a} | {args.b} | only {args.b} / only {args.a} right | "
          f"McNemar p | majority answer |")
    print("|---|---|---|---|---|---|---|")
    for kind, r in rows.items():
        fmt = lambda v, ci: f"{v:.3f} [{ci[0]:.2f}, {ci[1]:.2f}]"  # noqa: E731
        maj = "-" if r["majority"] is None else f"{r['majority']:.3f}"
        print(f"| {kind} | {r['n']} | {fmt(r['a'], r['a_ci'])} | {fmt(r['b'], r['b_ci'])} | "
              f"{r['only_b']} / {r['only_a']} | {r['mcnemar_p']:.2g} | {maj} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return rows


if __name__ == "__main__":
    main()
