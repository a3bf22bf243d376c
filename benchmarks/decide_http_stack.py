"""Which HTTP stack `jaxdm decide` runs on, decided by measurement (issue 41, section 3).

Three servers answer the same ``POST /decide`` (the Oracle backend, so the HTTP layer is what
is timed), each in its own process on 127.0.0.1:

- ``before``: the server as it was before issue 41 (``jaxdm/decide.py`` at commit f9db13c,
  loaded from git): headers and body in two unbuffered writes, no TCP_NODELAY;
- ``http.server``: today's ``jaxdm.decide.server.DecideServer`` (one write, TCP_NODELAY,
  timeouts, connection cap);
- ``asgi``: Starlette 1.7 + uvicorn 0.54 (h11) serving the same ``answers.answer`` function
  from a worker thread (``anyio.to_thread``), as the serving engines do.

Measured with a real client (httpx): ``keepalive`` = median round trip of sequential requests
on one kept-alive connection; ``concurrent`` = requests/s of 16 client threads, each with its
own kept-alive connection. Rounds alternate the servers; medians over rounds.

RESULT lines: ``keepalive_latency`` (before vs http.server), ``stack_keepalive`` and
``stack_16_clients`` (asgi vs http.server; ratio > 1: http.server better).

  python benchmarks/decide_http_stack.py --quick   # 1 round, 100 / 16 x 20 requests
  python benchmarks/decide_http_stack.py           # 5 rounds, 300 / 16 x 60 requests
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BEFORE_COMMIT = "f9db13c"
BODY = {"context": "Customer C-1042 wants a refund for order O-55120.",
        "question": "Which tool next?", "options": ["lookup_order", "refund_order", "ask"],
        "meta": {"oracle_answer": "refund_order"}}


# ------------------------------------------------------------------ servers (child process)

def _serve_before(port_file: str) -> None:
    source = subprocess.run(["git", "-C", str(REPO), "show", f"{BEFORE_COMMIT}:jaxdm/decide.py"],
                            capture_output=True, text=True, check=True).stdout
    path = Path(tempfile.mkdtemp()) / "decide_before.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("decide_before", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["decide_before"] = mod       # its dataclasses look their module up
    spec.loader.exec_module(mod)
    from jaxdm.decision import Oracle
    srv = mod.DecideServer(mod.MicroBatcher(Oracle()), "oracle", "127.0.0.1", 0)
    Path(port_file).write_text(str(srv.server_address[1]))
    srv.serve_forever()


def _serve_stdlib(port_file: str) -> None:
    from jaxdm.decide.scheduler import MicroBatcher
    from jaxdm.decide.server import DecideServer
    from jaxdm.decision import Oracle
    srv = DecideServer(MicroBatcher(Oracle()), "oracle", "127.0.0.1", 0)
    Path(port_file).write_text(str(srv.server_address[1]))
    srv.serve_forever()


def _serve_asgi(port_file: str) -> None:
    import socket

    import anyio
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    from jaxdm.decide.answers import answer
    from jaxdm.decide.protocol import RequestError, decode_body
    from jaxdm.decide.scheduler import MicroBatcher
    from jaxdm.decision import Oracle
    batcher = MicroBatcher(Oracle())

    async def decide(request: Request) -> JSONResponse:
        t0 = time.perf_counter()
        raw = await request.body()
        try:
            out, status = await anyio.to_thread.run_sync(
                lambda: answer(batcher, "oracle", decode_body(raw), t0, 300.0))
        except RequestError as e:
            out, status = e.to_json(), 400
        return JSONResponse(out, status_code=status)

    app = Starlette(routes=[Route("/decide", decide, methods=["POST"])])
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    Path(port_file).write_text(str(sock.getsockname()[1]))
    config = uvicorn.Config(app, log_level="error", http="h11", lifespan="off")
    uvicorn.Server(config).run(sockets=[sock])


SERVERS = {"before": _serve_before, "http.server": _serve_stdlib, "asgi": _serve_asgi}


def _start(kind: str) -> tuple[subprocess.Popen, int]:
    port_file = tempfile.mktemp()
    proc = subprocess.Popen([sys.executable, __file__, "--child", kind, port_file],
                            env={**os.environ, "JAX_PLATFORMS": "cpu"})
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if os.path.exists(port_file) and Path(port_file).read_text():
            time.sleep(0.3)
            return proc, int(Path(port_file).read_text())
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"{kind} server did not start")


# ------------------------------------------------------------------ the client

def _keepalive_ms(port: int, n: int) -> float:
    import httpx
    times = []
    with httpx.Client(base_url=f"http://127.0.0.1:{port}") as c:
        for i in range(n + 5):
            t0 = time.perf_counter()
            r = c.post("/decide", json=BODY)
            assert r.status_code == 200 and r.json()["choice"] == "refund_order", r.text
            if i >= 5:                     # the first few warm the connection and the server
                times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _concurrent_rps(port: int, clients: int, per_client: int) -> float:
    import httpx
    barrier = threading.Barrier(clients + 1)
    errors = []

    def run():
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as c:
            c.post("/decide", json=BODY)
            barrier.wait()
            for _ in range(per_client):
                if c.post("/decide", json=BODY).status_code != 200:
                    errors.append(1)

    threads = [threading.Thread(target=run) for _ in range(clients)]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    assert not errors
    return clients * per_client / wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--child", nargs=2, metavar=("KIND", "PORT_FILE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        SERVERS[args.child[0]](args.child[1])
        return
    rounds, n, per_client = (1, 100, 20) if args.quick else (5, 300, 60)
    results: dict[str, dict[str, list[float]]] = {k: {"ka": [], "rps": []} for k in SERVERS}
    for r in range(rounds):
        order = list(SERVERS) if r % 2 == 0 else list(SERVERS)[::-1]
        for kind in order:
            proc, port = _start(kind)
            try:
                results[kind]["ka"].append(_keepalive_ms(port, n))
                results[kind]["rps"].append(_concurrent_rps(port, 16, per_client))
            finally:
                proc.terminate()
                proc.wait(timeout=30)
            print(f"round {r}: {kind:12s} keep-alive {results[kind]['ka'][-1]:7.2f} ms, "
                  f"16 clients {results[kind]['rps'][-1]:7.1f} req/s", flush=True)
    med = {k: {m: statistics.median(v) for m, v in d.items()} for k, d in results.items()}
    b, s, a = med["before"], med["http.server"], med["asgi"]
    print(f"RESULT keepalive_latency: baseline {b['ka']:.2f} ms, jaxdm {s['ka']:.2f} ms, "
          f"ratio {b['ka'] / s['ka']:.2f}x")
    print(f"RESULT stack_keepalive: baseline {a['ka']:.2f} ms, jaxdm {s['ka']:.2f} ms, "
          f"ratio {a['ka'] / s['ka']:.2f}x")
    print(f"RESULT stack_16_clients: baseline {a['rps']:.1f} req/s, jaxdm {s['rps']:.1f} req/s, "
          f"ratio {s['rps'] / a['rps']:.2f}x")
    print(json.dumps({"medians": med, "rounds": rounds}))


if __name__ == "__main__":
    main()
