"""An in-process fake OpenAI-compatible chat endpoint (``POST /v1/chat/completions``) for tests of kb.ask.

Well-behaved, it answers from the numbered sources of kb.answer_prompt's user message: the first sentence
of each of the first two sources, each followed by its ``[n]``. Misbehaving modes prove the verification
and error paths: ``cite9`` (the second statement cites [9]), ``uncited`` (no citation at all),
``not_found`` (the refusal sentence), ``slow`` (answers after ``delay`` seconds), ``error500`` (HTTP 500
whose body echoes the Authorization header, like a careless server), ``malformed`` (200 without choices),
``stream`` (SSE deltas of the well-behaved answer, ``delay`` seconds apart; a request without
``stream: true`` gets plain JSON), ``echo`` (the well-behaved answer ending with the request's Authorization
header, streamed in 6-character deltas when asked to, so the key is split across deltas), ``model_echo`` (the
well-behaved answer, its ``model`` field naming the Authorization header). ``padding`` dots begin the error
message of ``error500``. Every request
body and its headers are recorded.

Use the ``fake_chat`` fixture: ``fake_chat(mode="answer", delay=0.0, padding=0)`` -> FakeChat (``.url`` is the base
URL ``http://127.0.0.1:<port>/v1``, ``.requests``, ``.headers``; ``.mode`` may be changed).
"""

from __future__ import annotations

import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

import pytest

MODES = ("answer", "cite9", "uncited", "not_found", "slow", "error500", "malformed", "stream", "echo", "model_echo")
MODEL = "fake-chat-1"
_SOURCE = re.compile(r"^\[(\d+)\] .*$", re.M)


def sources_of(prompt: str) -> dict[int, str]:
    """{n: text} of the numbered sources in kb.answer_prompt's user message."""
    body = prompt.split("Question:", 1)[0]
    marks = list(_SOURCE.finditer(body))
    out = {}
    for i, m in enumerate(marks):
        end = marks[i + 1].start() if i + 1 < len(marks) else len(body)
        out[int(m.group(1))] = body[m.end() : end].strip()
    return out


def first_sentence(text: str) -> str:
    for line in text.splitlines():
        line = line.strip().lstrip("#>-*| ").strip()
        if re.search(r"\w", line):
            return re.split(r"(?<=[。！？!?])|(?<=\.)\s", line, maxsplit=1)[0].strip()
    return text.strip()[:80]


def grounded_answer(prompt: str, mode: str) -> str:
    """The answer a well-behaved (or, per mode, a misbehaving) model gives to this prompt."""
    sources = sources_of(prompt)
    if mode == "not_found" or not sources:
        return (
            "知识库中未找到相关信息"
            if re.search(r"[\u4e00-\u9fff]", prompt.rsplit("Question:", 1)[-1])
            else ("Not found in the knowledge base.")
        )
    picked = sorted(sources)[:2]
    lines = []
    for i, n in enumerate(picked):
        sentence = first_sentence(sources[n])
        if mode == "uncited":
            lines.append(sentence)
        elif mode == "cite9" and i == 1:
            lines.append(f"{sentence} [9]")
        else:
            lines.append(f"{sentence} [{n}]")
    if mode == "cite9" and len(picked) == 1:
        lines.append("另外还有一点 [9]")
    return "\n".join(lines)


class FakeChat:
    def __init__(self, mode: str, delay: float, padding: int = 0) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}")
        self.mode = mode
        self.delay = delay
        self.requests: list[dict] = []
        self.headers: list[dict[str, str]] = []
        self.released = threading.Event()
        chat = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):  # noqa: N802 (http.server API)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if urlsplit(self.path).path.rstrip("/") not in ("/v1/chat/completions", "/chat/completions"):
                    return self._json(404, {"error": {"message": f"no route {self.path}"}})
                chat.requests.append(body)
                chat.headers.append(dict(self.headers))
                mode = chat.mode
                if mode == "slow":
                    chat.released.wait(chat.delay)
                if mode == "error500":
                    echoed = self.headers.get("Authorization", "")
                    message = f"{'.' * padding}internal error for {echoed}"
                    return self._json(500, {"error": {"message": message, "type": "x"}})
                if mode == "malformed":
                    return self._json(200, {"id": "x", "object": "chat.completion", "model": MODEL})
                prompt = body["messages"][-1]["content"]
                text = grounded_answer(prompt, "answer" if mode in ("slow", "stream", "echo", "model_echo") else mode)
                served = f"gpt {self.headers.get('Authorization', '')}" if mode == "model_echo" else MODEL
                if mode == "echo":
                    text += f" (served for {self.headers.get('Authorization', '')})"
                if mode in ("stream", "echo", "model_echo") and body.get("stream"):
                    return self._stream(text, served)
                self._json(
                    200,
                    {
                        "id": "chatcmpl-fake",
                        "object": "chat.completion",
                        "model": served,
                        "choices": [
                            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
                        ],
                    },
                )

            def _json(self, status: int, answer: dict) -> None:
                data = json.dumps(answer, ensure_ascii=False).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _stream(self, text: str, served: str) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                pieces = [text[i : i + 6] for i in range(0, len(text), 6)]
                for i, piece in enumerate(pieces):
                    event = {
                        "id": "chatcmpl-fake",
                        "object": "chat.completion.chunk",
                        "model": served,
                        "choices": [
                            {
                                "index": 0,
                                "delta": ({"role": "assistant"} if i == 0 else {}) | {"content": piece},
                                "finish_reason": None,
                            }
                        ],
                    }
                    self.wfile.write(f"data: {json.dumps(event, ensure_ascii=False)}\n\n".encode())
                    self.wfile.flush()
                    if chat.delay:
                        time.sleep(chat.delay)
                last = {"model": served, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
                self.wfile.write(f"data: {json.dumps(last)}\n\ndata: [DONE]\n\n".encode())
                self.wfile.flush()
                self.close_connection = True

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.released.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fake_chat():
    """Start fake OpenAI-compatible chat endpoints for one test: ``fake_chat(mode="answer", delay=0.0, padding=0)``."""
    started: list[FakeChat] = []

    def start(mode: str = "answer", delay: float = 0.0, padding: int = 0) -> FakeChat:
        chat = FakeChat(mode, delay, padding)
        started.append(chat)
        return chat

    yield start
    for chat in started:
        chat.close()
