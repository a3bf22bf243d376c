"""Decision endpoint: 16 concurrent HTTP clients, micro-batched vs one request at a time.

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

  python benchmarks/decide_endpoint.py --quick   # shared workload, 1 request per client, 1 round
  python benchmarks/decide_endpoint.py           # both workloads, 3 per client, 3 rounds
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="shared workload, 1 request per "
                                                             "client, 1 timed round")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--per-client", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--max-wait-ms", type=float, default=20.0)
    args = parser.parse_args()
    per_client = args.per_client or (1 if args.quick else 3)
    rounds = args.rounds or (1 if args.quick else 3)
    workloads = ("shared",) if args.quick else ("shared", "distinct")

    from jaxdm.decide import DecideServer, MicroBatcher
    from jaxdm.decision import LocalReadout
    from jaxdm.models.smollm2 import smollm2

    t0 = time.perf_counter()
    dm = LocalReadout(smollm2(), max_groups_per_call=16)
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
    print()
    for name, unit, b, j, higher_better in results:
        ratio = j / b if higher_better else b / j
        print(f"RESULT {name}: baseline {b:.3f} {unit}, jaxdm {j:.3f} {unit}, ratio {ratio:.2f}x")


if __name__ == "__main__":
    main()
