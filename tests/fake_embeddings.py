"""A fake OpenAI-compatible embedding endpoint on 127.0.0.1 for tests (the ``fake_embeddings`` fixture in
conftest.py starts them; tests that need one outside a test function import the class from here)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit


class FakeEmbeddings:
    """One fake OpenAI-compatible ``POST /v1/embeddings`` endpoint on 127.0.0.1 (see ``fake_embeddings``)."""

    def __init__(
        self, vectors: Callable[[list[str]], Sequence], statuses: Sequence[int], stall: bool, padding: int = 0
    ) -> None:
        self.requests: list[dict] = []  # the JSON bodies received, in order
        self.times: list[float] = []  # time.monotonic() at each request's arrival
        self.released = threading.Event()
        endpoint, script = self, list(statuses)

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server API)
                if urlsplit(self.path).path != "/v1/embeddings":
                    return self._answer(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                endpoint.requests.append(body)
                endpoint.times.append(time.monotonic())
                if stall:
                    endpoint.released.wait(300)
                    return  # no answer: the connection closes when the test is over
                if script:
                    status = script.pop(0)
                    # like a careless server: the error echoes the request line and its Authorization header
                    echoed = f"{self.path} as {self.headers.get('Authorization', 'no key')}"
                    message = f"{'.' * padding}scripted {status} for {echoed}"
                    return self._answer(status, {"error": {"message": message, "type": "x", "code": "x"}})
                texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
                data = [
                    {"object": "embedding", "index": i, "embedding": [float(x) for x in v]}
                    for i, v in enumerate(vectors(texts))
                ]
                self._answer(200, {"object": "list", "model": body.get("model", ""), "data": data})

            def _answer(self, status: int, answer: dict) -> None:
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/embeddings"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.released.set()
        self.server.shutdown()
        self.server.server_close()
