"""A small deduplicating HTTP service on 127.0.0.1 for KEYED-tool tests.

``POST /objects`` with an ``Idempotency-Key`` header creates an object, unless an
object was already created under that key: then the first object is returned again
(``"replayed": true``). Objects, keys and every request are kept in a JSON file, so
the test can count what the service really did.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


class DedupStore:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock = threading.Lock()
        self.path.write_text(json.dumps({"objects": [], "keys": {}, "requests": []}))

    def load(self) -> dict[str, Any]:
        return json.loads(self.path.read_text())  # type: ignore[no-any-return]

    def create(self, key: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        with self.lock:
            data = self.load()
            data["requests"].append({"key": key, "body": body})
            if key in data["keys"]:
                found = next(o for o in data["objects"] if o["id"] == data["keys"][key])
                status, answer = 200, {**found, "replayed": True}
            else:
                obj = {"id": f"obj-{len(data['objects']) + 1}", "name": body.get("name")}
                data["objects"].append(obj)
                data["keys"][key] = obj["id"]
                status, answer = 201, {**obj, "replayed": False}
            self.path.write_text(json.dumps(data))
            return status, answer


@contextmanager
def dedup_service(path: Path) -> Iterator[tuple[int, DedupStore]]:
    """Serve a ``DedupStore`` at ``path`` in a thread; yields (port, store)."""
    store = DedupStore(path)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            key = self.headers.get("Idempotency-Key")
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            if not key:
                status, answer = 400, {"error": "an Idempotency-Key header is required"}
            else:
                status, answer = store.create(key, body)
            payload = json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], store
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
