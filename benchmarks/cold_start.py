"""Cold start of a scoring job (issue 17): where a fresh process's time goes before its first score.

One job, as the ``jaxdm`` command runs it: import, turn on JAX's persistent compilation cache,
load SmolLM2-135M-Instruct (fp32; config, tokenizer, params), ``LocalReadout`` judging of one
ALFWorld-shaped trajectory (``jaxdm.decision.synthetic``) under Hindsight + Progress. Each run
is a fresh Python process; the "first" run starts with an empty compilation-cache folder, the
"second" reuses the first's folder (issue 17 goals: first <= 20 s, second <= 5 s).

The child prints a timeline (seconds since the parent spawned it, ``time.time``): interpreter
up, ``import jax``, the jaxdm imports, config, tokenizer, params, model, first scores; JAX's own
durations (tracing, lowering to StableHLO, XLA compiles, persistent-cache reads; with
``--diagnose`` also the time spent computing persistent-cache keys), cache hits / misses, and
which heavy modules (torch, transformers, scipy, matplotlib, pandas, alfworld, ...) were
imported before the first score.

Before / after (``--trees A,B``): each tree is a jaxdm source folder (a ``git worktree`` of a
commit); ``--plain`` adds a variant of the last tree whose scoring program is the plain
``jax.jit`` (since commit 5fbb85e ``score_requests`` goes through
``jaxdm.models.compile_cache.stored`` by default: whole compiled programs loaded without
tracing; trees older than that are plain anyway). Rounds
alternate the variants, each round runs a first and a second run per variant (each with its
own fresh cache folder), and the medians per variant are reported, with the scores compared
bitwise across every run. ``--importtime`` prints the slowest imports (``-X importtime``)
of the child's import line.

    python benchmarks/cold_start.py --quick              # 6-action trajectory, 1 round
    python benchmarks/cold_start.py --rounds 3 --trees /work/snap-before,/work/main
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HEAVY = ("torch", "transformers", "scipy", "matplotlib", "pandas", "alfworld", "sklearn",
         "tqdm", "httpx", "yaml", "ray", "jinja2", "opt_einsum")

IMPORTS = ("from jaxdm import roles\n"
           "from jaxdm.decision.local import LocalReadout\n"
           "from jaxdm.decision.synthetic import alfworld_like_trajectory\n"
           "from jaxdm.models import compile_cache\n"
           "from jaxdm.models.loading import Pretrained, load_params, load_tokenizer, "
           "read_chat_template, read_config\n"
           "from jaxdm.models.smollm2 import smollm2_path\n")

CHILD = r"""
import json, sys, time
t0 = float(sys.argv[1])
n_actions, diagnose, heavy_names = int(sys.argv[2]), sys.argv[3] == "1", sys.argv[4].split(",")
n_warm, use_plain = int(sys.argv[5]), sys.argv[6] == "1"
marks = {"python_up": time.time() - t0}
import jax
marks["import_jax"] = time.time() - t0
from jax import monitoring
dur, events, calls = {}, {}, []
def _listen(name, secs, **kw):
    dur[name] = dur.get(name, 0.0) + secs
    events[name] = events.get(name, 0) + 1
monitoring.register_event_duration_secs_listener(_listen)
monitoring.register_event_listener(
    lambda name, **kw: events.__setitem__(name, events.get(name, 0) + 1))
IMPORTS
marks["import_jaxdm"] = time.time() - t0
if use_plain:  # the scorer as a plain jax.jit, not through compile_cache.stored
    compile_cache.stored = lambda jitted, static_argnames: jitted
if diagnose:  # time spent hashing lowered modules into persistent-cache keys
    def _timed(fn, name):  # fn, adding its seconds to dur[name]
        def timed(*a, **k):
            s = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                dur[name] = dur.get(name, 0.0) + time.perf_counter() - s
        return timed
    from jax._src import compilation_cache as _cc
    _cc.get_cache_key = _timed(_cc.get_cache_key, "cache_key")
    from jaxdm.decision import shared_prefix as _sp
    # keep what score_requests calls (stored unless --plain): a plain function passed to
    # compile_cache.stored is returned as is
    _packed = compile_cache.stored(_sp.score_packed, ("config", "window", "full_vocab"))
    def _timed_packed(*a, **k):  # one device call: dispatch (trace, lower, compile) + run
        start = time.time()
        out = jax.block_until_ready(_packed(*a, **k))
        calls.append((round(start - t0, 3), round(time.time() - start, 3)))
        return out
    _sp.score_packed = _timed_packed
    # loading a stored program
    compile_cache._read_program = _timed(compile_cache._read_program, "stored_load")
compile_cache.enable()
folder = smollm2_path()
config = read_config(folder)
marks["config"] = time.time() - t0
tokenizer = load_tokenizer(folder)
marks["tokenizer"] = time.time() - t0
params = load_params(folder, config)
jax.block_until_ready(params)
marks["params"] = time.time() - t0
pre = Pretrained(params=params, config=config, tokenizer=tokenizer,
                 chat_template=read_chat_template(folder), path=folder)
model = LocalReadout(pre, max_groups_per_call=1)
marks["model"] = time.time() - t0
qs = roles.judge_requests(alfworld_like_trajectory(100, n_actions), "progress", "hindsight")
heavy_before = sorted(m for m in heavy_names if m in sys.modules)
scores = [r.score for r in model.score(qs)]
marks["first_scores"] = time.time() - t0
warm = []
for _ in range(n_warm):  # the same job again in this process: what running it costs
    s = time.perf_counter()
    again = [r.score for r in model.score(qs)]
    warm.append(time.perf_counter() - s)
    assert again == scores, "a warm rerun gave other scores"
short = {k.rsplit("/", 1)[-1]: round(v, 3) for k, v in dur.items()}
print("COLD " + json.dumps({
    "jaxdm": sys.modules["jaxdm"].__file__, "marks": marks, "warm": warm, "calls": calls,
    "durations": short, "scores": scores, "heavy": heavy_before,
    "traces": events.get("/jax/core/compile/jaxpr_trace_duration", 0),
    "compiles": events.get("/jax/core/compile/backend_compile_duration", 0),
    "hits": events.get("/jax/compilation_cache/cache_hits", 0),
    "misses": events.get("/jax/compilation_cache/cache_misses", 0)}))
""".replace("IMPORTS\n", IMPORTS)

# Durations JAX reports (event names' last part) worth a column, in order.
DURATIONS = ("jaxpr_trace_duration", "jaxpr_to_mlir_module_duration", "cache_key",
             "cache_retrieval_time_sec", "backend_compile_duration", "stored_load")


def starts_scoring(res: dict) -> float | None:
    """When the first device call starts running (``--diagnose``): its start plus what JAX spent
    dispatching it (tracing, lowering, compile or persistent-cache key + read, stored-program
    load). The job has one program, so every dispatch duration belongs to its first call."""
    if not res["calls"]:
        return None
    # backend_compile_duration covers the persistent-cache key and read too
    parts = ("jaxpr_trace_duration", "jaxpr_to_mlir_module_duration",
             "backend_compile_duration", "stored_load")
    return res["calls"][0][0] + sum(res["durations"].get(k) or 0.0 for k in parts)


def run_child(tree: Path, cache: Path, n_actions: int, diagnose: bool, warm: int,
              plain: bool) -> dict:
    """One fresh process scoring the job with jaxdm from ``tree``, compilation cache ``cache``."""
    env = {**os.environ, "JAXDM_COMPILATION_CACHE": str(cache), "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, "-c", CHILD, repr(time.time()), str(n_actions),
                          "1" if diagnose else "0", ",".join(HEAVY), str(warm),
                          "1" if plain else "0"], env=env,
                         capture_output=True, text=True, timeout=1800, cwd=tree)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("COLD ")]
    if out.returncode or not lines:
        raise SystemExit(f"cold-start child ({tree}) failed ({out.returncode}):\n"
                         f"{out.stderr[-3000:]}")
    return json.loads(lines[-1][len("COLD "):])


def import_profile(tree: Path, top: int) -> None:
    """The slowest imports (cumulative, -X importtime) of the child's import line."""
    code = "import jax\n" + IMPORTS
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, "-X", "importtime", "-c", code], env=env, cwd=tree,
                         capture_output=True, text=True, timeout=600)
    rows = []
    for line in out.stderr.splitlines():
        if line.startswith("import time:") and "|" in line and "cumulative" not in line:
            _, cum, name = line[len("import time:"):].split("|")
            rows.append((int(cum), name.rstrip()))
    top_level = [r for r in rows if not r[1].startswith("  ")]
    print(f"[imports, {tree}] top-level {[(n.strip(), round(c / 1e6, 2)) for c, n in top_level]}")
    for cum, name in sorted(rows, reverse=True)[:top]:
        print(f"  {cum / 1e6:6.3f} s {name}")


def _steps(marks: dict) -> dict:
    """Per-step seconds from the cumulative marks."""
    out, prev = {}, 0.0
    for k, v in marks.items():
        out[k] = v - prev
        prev = v
    return out


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="6-action trajectory, 1 round")
    parser.add_argument("--actions", type=int, default=None, help="default 30 (6 with --quick)")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--second-runs", type=int, default=1,
                        help="second runs per round and variant (after each first run)")
    parser.add_argument("--trees", default=None,
                        help="comma-separated jaxdm source folders to alternate (default: this "
                             "checkout)")
    parser.add_argument("--plain", action="store_true",
                        help="also run the last tree with the scoring program as a plain "
                             "jax.jit (not compile_cache.stored), alternated with the others")
    parser.add_argument("--warm", type=int, default=0, metavar="N",
                        help="after the first scores, run the same job N more times in the "
                             "process (its warm cost)")
    parser.add_argument("--diagnose", action="store_true",
                        help="also time the persistent-cache key computation and each device "
                             "call")
    parser.add_argument("--importtime", type=int, default=0, metavar="N",
                        help="print the N slowest imports of each tree first")
    args = parser.parse_args()
    n_act = args.actions or (6 if args.quick else 30)
    rounds = args.rounds or (1 if args.quick else 3)
    here = Path(__file__).resolve().parents[1]
    trees = [Path(t).resolve() for t in args.trees.split(",")] if args.trees else [here]
    variants = [(t, False) for t in trees] + ([(trees[-1], True)] if args.plain else [])
    names = [f"{t.name}{'+plain' if pl else ''}" for t, pl in variants]
    for tree in trees:
        if args.importtime:
            import_profile(tree, args.importtime)
    runs: dict[tuple[int, str], list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="jaxdm-cold-") as tmp:
        for r in range(rounds):
            order = list(range(len(variants)))
            order = order if r % 2 == 0 else order[::-1]
            for vi in order:
                tree, plain = variants[vi]
                cache = Path(tmp) / f"r{r}-v{vi}"
                for label in ["first"] + ["second"] * args.second_runs:
                    res = run_child(tree, cache, n_act, args.diagnose, args.warm, plain)
                    if not res["jaxdm"].startswith(str(tree)):
                        raise SystemExit(f"the child imported {res['jaxdm']}, not {tree}")
                    runs.setdefault((vi, label), []).append(res)
                    steps = {k: round(v, 2) for k, v in _steps(res["marks"]).items()}
                    durs = {k: res["durations"].get(k) for k in DURATIONS}
                    print(f"[round {r}, {names[vi]}, {label} run, load {_load()}] "
                          f"first scores at {res['marks']['first_scores']:.2f} s; starts "
                          f"scoring at {starts_scoring(res) or 0.0:.2f} s; warm reruns "
                          f"{[round(w, 2) for w in res['warm']]} s; device calls (start, s) "
                          f"{res['calls'][:4]}; steps (s) {steps}; JAX (s) {durs}; traces "
                          f"{res['traces']}, compiles {res['compiles']}, cache hits "
                          f"{res['hits']}, misses {res['misses']}; heavy modules before "
                          f"scoring: {res['heavy']}", flush=True)
    ref = runs[0, "first"][0]["scores"]
    same = all(res["scores"] == ref for rs in runs.values() for res in rs)
    print(f"scores bitwise equal across every run and variant: {same}")
    medians = {}
    for vi, name in enumerate(names):
        for label, goal in (("first", 20.0), ("second", 5.0)):
            rs = runs[vi, label]
            t = medians[vi, label] = statistics.median(x["marks"]["first_scores"] for x in rs)
            med = {k: round(statistics.median(_steps(x["marks"])[k] for x in rs), 2)
                   for k in rs[0]["marks"]}
            jx = {k: round(statistics.median(x["durations"].get(k) or 0.0 for x in rs), 3)
                  for k in DURATIONS}
            start = [starts_scoring(x) for x in rs]
            start = round(statistics.median(start), 2) if None not in start else None
            print(f"[median, {name}, {label} run, {len(rs)} runs] first scores {t:.2f} s, starts "
                  f"scoring {start} s; steps {med}; JAX {jx}")
            print(f"RESULT cold_start_{label}_run_{name}: baseline {goal:.3f} s (issue 17 "
                  f"goal), jaxdm {t:.3f} s, ratio {goal / t:.2f}x")
    for vi in range(1, len(variants)):
        for label in ("first", "second"):
            a, b = medians[0, label], medians[vi, label]
            print(f"RESULT cold_start_{label}_run_{names[0]}_vs_{names[vi]}: baseline {a:.3f} "
                  f"s, jaxdm {b:.3f} s, ratio {a / b:.2f}x")
    if not same:
        raise SystemExit("scores differ between runs")


if __name__ == "__main__":
    main()
