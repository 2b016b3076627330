"""A small ticket service for the examples and tests: a real HTTP server on 127.0.0.1.

Tickets are stored as JSON lines in a file (fsynced), so a ticket created before a
crash of the agent is still there afterwards. Two flavours:

* ``dedup=True``: ``POST /tickets`` with an ``Idempotency-Key`` header creates at
  most one ticket per key (a repeat returns the first one), and
  ``GET /tickets?key=K`` looks a ticket up by key — what a KEYED tool and its
  reconcile need.
* ``dedup=False``: every POST creates a ticket and there is no lookup — the kind of
  service for which only a NEVER tool is honest.

``POST /tickets/<id>/close`` closes a ticket (a compensation). ``GET /tickets``
lists them; ``GET /stats`` counts the POST requests received.

Run it standalone: ``python examples/ticket_service.py --port 8900 --file t.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse


class TicketStore:
    def __init__(self, path: Path, *, dedup: bool) -> None:
        self.path = path
        self.dedup = dedup
        self.lock = threading.Lock()
        self.posts = 0

    def all(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        tickets: dict[str, dict[str, Any]] = {}
        for line in self.path.read_text().splitlines():
            entry = json.loads(line)
            tickets[entry["id"]] = entry
        return list(tickets.values())

    def _write(self, ticket: dict[str, Any]) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (json.dumps(ticket) + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)

    def create(self, title: str, body: str, key: str | None) -> tuple[int, dict[str, Any]]:
        with self.lock:
            self.posts += 1
            tickets = self.all()
            if self.dedup and key:
                for ticket in tickets:
                    if ticket.get("key") == key:
                        return 200, ticket
            ticket = {
                "id": f"T-{len(tickets) + 1}",
                "title": title,
                "body": body,
                "key": key if self.dedup else None,
                "status": "open",
            }
            self._write(ticket)
            return 201, ticket

    def by_key(self, key: str) -> dict[str, Any] | None:
        return next((t for t in self.all() if t.get("key") == key), None)

    def close(self, ticket_id: str) -> dict[str, Any] | None:
        with self.lock:
            for ticket in self.all():
                if ticket["id"] == ticket_id:
                    ticket = {**ticket, "status": "closed"}
                    self._write(ticket)
                    return ticket
        return None


def _handler(store: TicketStore) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _reply(self, status: int, payload: Any) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            url = urlparse(self.path)
            if url.path == "/stats":
                return self._reply(200, {"posts": store.posts, "tickets": len(store.all())})
            if url.path != "/tickets":
                return self._reply(404, {"error": "not found"})
            key = parse_qs(url.query).get("key", [None])[0]
            if key is None:
                return self._reply(200, store.all())
            if not store.dedup:
                return self._reply(501, {"error": "this service has no lookup by key"})
            found = store.by_key(key)
            return self._reply(200, found) if found else self._reply(404, {"error": "no ticket"})

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            try:
                body = json.loads(self.rfile.read(length) or b"{}")
            except ValueError:
                return self._reply(400, {"error": "malformed JSON"})
            parts = self.path.strip("/").split("/")
            if parts == ["tickets"]:
                status, ticket = store.create(
                    str(body.get("title", "")),
                    str(body.get("body", "")),
                    self.headers.get("Idempotency-Key"),
                )
                return self._reply(status, ticket)
            if len(parts) == 3 and parts[0] == "tickets" and parts[2] == "close":
                closed = store.close(parts[1])
                return self._reply(200, closed) if closed else self._reply(404, {"error": "no"})
            return self._reply(404, {"error": "not found"})

    return Handler


def start(path: Path, *, dedup: bool = True, port: int = 0) -> tuple[ThreadingHTTPServer, str]:
    """Serve in a daemon thread; returns the server and its base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", port), _handler(TicketStore(path, dedup=dedup)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8900)
    parser.add_argument("--file", type=Path, default=Path("tickets.jsonl"))
    parser.add_argument("--no-dedup", action="store_true")
    args = parser.parse_args()
    srv = ThreadingHTTPServer(
        ("127.0.0.1", args.port), _handler(TicketStore(args.file, dedup=not args.no_dedup))
    )
    print(f"ticket service on http://127.0.0.1:{args.port} (dedup={not args.no_dedup})")
    srv.serve_forever()
