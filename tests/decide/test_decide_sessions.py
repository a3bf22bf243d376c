"""Concurrent agent sessions through `jaxdm decide` (issue 41 §2): 8 clients over real sockets,
each growing its own context, are answered one step at a time in ONE packed device call over
8 different cached prefixes, with the probabilities of the uncached path (within 1e-5)."""
import http.client
import json
import threading

import numpy as np

from jaxdm.decide.scheduler import MicroBatcher
from jaxdm.decide.server import DecideServer
from jaxdm.decision import MultipleChoice
from jaxdm.decision.local import LocalReadout
from tests.decision.dm_fixtures import tiny_pretrained

OPTIONS = ["look", "take mug 1", "go to cabinet 2", "open cabinet 2", "inventory"]
SESSIONS, STEPS = 8, 4


def _context(session: int, step: int) -> str:
    ctx = f"Session {session}. Your task: put a clean mug {session} in cabinet {session % 5}."
    for t in range(step + 1):
        ctx += (f"\nStep {t}: you see a table {t}, a sink {session} and a mug {t + session}."
                f" > go to table {t}\nYou arrive at table {t}.")
    return ctx


def _questions(ctx: str) -> list[dict]:
    return [{"context": ctx, "question": "Which action next?", "options": OPTIONS},
            {"context": ctx, "question": "Is the task finished?", "options": ["yes", "no"]}]


def test_eight_sessions_score_in_one_cached_call_per_step():
    pre = tiny_pretrained()
    backend = LocalReadout(pre, max_groups_per_call=SESSIONS)
    plain = LocalReadout(pre, prefix_cache_mb=0)
    # the batch closes when all 16 questions of a step are in (or after 2 s)
    batcher = MicroBatcher(backend, max_batch=2 * SESSIONS, max_wait_ms=2000.0)
    srv = DecideServer(batcher, "tiny", "127.0.0.1", 0)
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05},
                     daemon=True).start()
    got: dict = {}
    errors: list = []
    step_done = threading.Barrier(SESSIONS + 1)

    def client(s: int) -> None:
        conn = http.client.HTTPConnection(*srv.server_address[:2], timeout=120)
        try:
            for t in range(STEPS):
                conn.request("POST", "/decide",
                             body=json.dumps({"requests": _questions(_context(s, t))}))
                resp = conn.getresponse()
                body = json.loads(resp.read())
                if resp.status != 200:
                    errors.append(body)
                got[s, t] = [r["probs"] for r in body.get("results", [])]
                step_done.wait(120)
        finally:
            conn.close()

    threads = [threading.Thread(target=client, args=(s,)) for s in range(SESSIONS)]
    try:
        for th in threads:
            th.start()
        calls = []
        for t in range(STEPS):
            step_done.wait(120)
            calls.append(backend.stats["calls"])
        for th in threads:
            th.join(120)
        assert not errors, errors[:2]
        # one backend call and one device call per step, all 8 sessions in it
        assert batcher.stats()["calls"] == STEPS and batcher.stats()["largest_batch"] == 16
        assert np.diff([0] + calls).tolist() == [1] * STEPS, calls
        st = backend.cache_stats()
        # from step 2 on every session reuses its own cached prefix
        assert st["hits"] >= SESSIONS * (STEPS - 1) and st["tokens_reused"] > 0, st
        # /stats reports the scoring work: the tokens run, and those the cache saved
        conn = http.client.HTTPConnection(*srv.server_address[:2], timeout=60)
        conn.request("GET", "/stats")
        scoring = json.loads(conn.getresponse().read())["scoring"]
        conn.close()
        assert scoring == backend.stats, (scoring, backend.stats)
        assert scoring["calls"] == STEPS and scoring["cached_tokens"] > 0
        assert 0 < scoring["unique_tokens"] < scoring["request_tokens"]
        for (s, t), probs in got.items():
            ref = plain.choose([MultipleChoice(q["context"], q["question"], tuple(q["options"]))
                                for q in _questions(_context(s, t))])
            for p, r in zip(probs, ref):
                np.testing.assert_allclose(p, r.probs, atol=1e-5)
    finally:
        srv.shutdown()
        srv.server_close()
        batcher.close()
