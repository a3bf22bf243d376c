"""A base for the tests' real HTTP model servers (on 127.0.0.1): quiet, reads the POSTed
JSON, answers bytes or an OpenAI-style chat completion; ``serve`` runs one."""
from __future__ import annotations

import contextlib
import http.server
import json
import threading


class JSONHandler(http.server.BaseHTTPRequestHandler):
    """``BaseHTTPRequestHandler`` without the request log, with JSON in and out."""

    def log_message(self, *args):
        pass

    def request_json(self) -> dict:
        """The POSTed body, parsed."""
        return json.loads(self.rfile.read(int(self.headers["Content-Length"])))

    def reply(self, status: int, data: bytes) -> None:
        """Answers ``status`` with the JSON bytes ``data``."""
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def reply_chat(self, text: str, prompt_tokens: int, completion_tokens: int) -> None:
        """Answers 200 with a chat completion whose message is ``text``, and its usage."""
        self.reply(200, json.dumps({
            "choices": [{"message": {"content": text}}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens},
        }).encode())


@contextlib.contextmanager
def serve(handler_class, poll_interval: float = 0.5):
    """A ``ThreadingHTTPServer`` with ``handler_class`` on a free port of 127.0.0.1, served from
    a daemon thread; yields the server (its base URL as ``server.url``), shut down on exit."""
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler_class)
    srv.url = f"http://127.0.0.1:{srv.server_address[1]}"
    threading.Thread(target=srv.serve_forever, args=(poll_interval,), daemon=True).start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()
