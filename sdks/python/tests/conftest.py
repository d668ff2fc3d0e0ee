"""Fixtures: a local receiver, and the live spindle processes `tests/sdks.rs` starts."""

from __future__ import annotations

import http.server
import json
import os
import pathlib
import sys
import threading

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

VECTORS = pathlib.Path(__file__).resolve().parents[2] / "webhook-vectors.json"


@pytest.fixture
def vectors():
    return json.loads(VECTORS.read_text())["vectors"]


class Receiver:
    """An HTTP server on 127.0.0.1 that records every request and answers from `script`
    (a list of (status, headers, body) taken in turn; then 200)."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, dict[str, str], bytes]] = []
        self.script: list[tuple[int, dict[str, str], bytes]] = []
        self.arrived = threading.Condition()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _any(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length)
                with outer.arrived:
                    outer.requests.append((self.command, self.path, dict(self.headers), body))
                    status, headers, answer = outer.script.pop(0) if outer.script else (200, {}, b"")
                    outer.arrived.notify_all()
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("content-length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            do_POST = do_GET = do_PUT = do_DELETE = _any

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def wait(self, count: int, path: str = "", timeout: float = 30.0):
        """The first `count` requests to paths starting with `path`."""
        def got():
            return [r for r in self.requests if r[1].startswith(path)]
        with self.arrived:
            self.arrived.wait_for(lambda: len(got()) >= count, timeout)
            return got()


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.server.shutdown()


def _live(name: str) -> str:
    url = os.environ.get(name)
    if not url:
        pytest.skip(f"{name} is not set (tests/sdks.rs starts the processes and sets it)")
    return url


@pytest.fixture
def router_url() -> str:
    return _live("SPINDLE_ROUTER_URL")


@pytest.fixture
def director_url() -> str:
    return _live("SPINDLE_DIRECTOR_URL")
