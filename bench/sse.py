"""Streaming over the daemon: N Server-Sent Event clients follow one session.

    python bench/sse.py WORKDIR SUBSCRIBERS K [--procs P | --curl] [--probe]

Starts a real ``perdure serve`` (scripted model, the benchmark's ``lookup`` tool),
connects SUBSCRIBERS clients to one session's event stream, then runs a K-turn
task. For every committed record each client receives, the delay is the client's
wall clock at arrival minus the record's ``at`` (the moment its decision was
taken, just before its commit): commit + fan-out + HTTP + the client, as a
frontend sees it.

The clients are lean Python readers (raw socket, chunked decoding, a regex) in P
child processes (``sse.py clients ...``, SUBSCRIBERS / P each), or with ``--curl``
one ``curl`` process each (C, no parsing; they report no arrival times), so that
the measuring side's own cost can be varied. With ``--probe`` the daemon runs
under ``bench/sse_probe.py``, which stamps each record when it is durable, when the
bus has it, when each response hands its frame to the ASGI ``send`` and when its
bytes go into each socket; joined with the clients' arrival times (by the client's
port) that splits every delivery into the daemon's share (decision -> bytes
written to that client's socket) and the client's share (socket -> the client has
parsed the frame).

Prints one JSON line: p50/p99 in ms, deliveries, the daemon's CPU per delivery,
and with ``--probe`` the stages.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import trio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import workload  # noqa: E402
from bench.common import server_env, start_serve  # noqa: E402

_AT = re.compile(rb'"at":([0-9.eE+-]+)')
_ID = re.compile(rb"^id: (\d+)$", re.M)

# (client port, seq, record's at, arrival or None) for every committed record a
# client got
Delivery = tuple[int, int, float, float | None]


def script(k: int) -> list[dict[str, Any]]:
    turn = {
        "text": workload.REPLY_TEXT,
        "tool_uses": [{"name": workload.TOOL_NAME, "input": dict(workload.TOOL_ARGS)}],
    }
    return [dict(turn) for _ in range(k)] + [{"text": workload.FINAL_TEXT}]


def start_daemon(
    workdir: Path, k: int, probe: Path | None
) -> tuple[subprocess.Popen[str], str, str]:
    (workdir / "script.json").write_text(json.dumps({"replies": script(k)}))
    entry = ["-m", "perdure.cli"]
    if probe is not None:
        entry = [str(ROOT / "bench" / "sse_probe.py"), str(probe)]
    provider = ["--provider", f"scripted:{workdir / 'script.json'}"]
    return start_serve(workdir, provider, server_env(), entry)


# -- the Python clients (a child process) ---------------------------------------------------


async def follow(
    host: str,
    port: int,
    token: str,
    sid: str,
    deliveries: list[Delivery],
    connected: trio.Semaphore,
) -> None:
    """A lean SSE client (raw socket, chunked decoding, a regex for ``at``) so that the
    measuring side adds as little as possible to what it measures."""
    stream = await trio.open_tcp_stream(host, port)
    me = stream.socket.getsockname()[1]
    request = (
        f"GET /v1/sessions/{sid}/events HTTP/1.1\r\nHost: {host}\r\n"
        f"Authorization: Bearer {token}\r\nAccept: text/event-stream\r\n\r\n"
    )
    async with stream:
        await stream.send_all(request.encode())
        raw = b""
        while b"\r\n\r\n" not in raw:
            raw += await stream.receive_some(65536)
        _, raw = raw.split(b"\r\n\r\n", 1)
        connected.release()
        payload = b""
        while True:
            # De-chunk what we have: size line, data, CRLF.
            while True:
                line_end = raw.find(b"\r\n")
                if line_end < 0:
                    break
                size = int(raw[:line_end].split(b";")[0] or b"0", 16)
                if len(raw) < line_end + 2 + size + 2:
                    break
                payload += raw[line_end + 2 : line_end + 2 + size]
                raw = raw[line_end + 2 + size + 2 :]
                if size == 0:
                    return
            *frames, payload = payload.split(b"\n\n")
            now = time.time()
            for frame in frames:
                if frame.startswith(b"id:"):
                    at, seq = _AT.search(frame), _ID.search(frame)
                    if at and seq:
                        deliveries.append((me, int(seq.group(1)), float(at.group(1)), now))
                    if b"event: RunFinished" in frame:
                        return
            chunk = await stream.receive_some(65536)
            if not chunk:
                return
            raw += chunk


async def clients(url: str, token: str, sid: str, count: int) -> list[Delivery]:
    """``count`` clients in this process: prints ``ready`` once all are connected and
    their replay is over, then follows until every stream has seen the run finish."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    deliveries: list[Delivery] = []
    connected = trio.Semaphore(0, max_value=count)
    async with trio.open_nursery() as nursery:
        for _ in range(count):
            nursery.start_soon(follow, host, int(port), token, sid, deliveries, connected)
        for _ in range(count):
            await connected.acquire()
        await trio.sleep(0.5)  # replayed history is not part of the measurement
        deliveries.clear()
        print("ready", flush=True)
    return deliveries


def python_clients(
    url: str, token: str, sid: str, subscribers: int, procs: int
) -> list[subprocess.Popen[str]]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    shares = [subscribers // procs + (i < subscribers % procs) for i in range(procs)]
    children = [
        subprocess.Popen(
            [sys.executable, __file__, "clients", url, token, sid, str(count)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        for count in shares
        if count
    ]
    for child in children:
        assert child.stdout is not None
        if child.stdout.readline().strip() != "ready":
            raise SystemExit("an SSE client process did not connect")
    return children


# -- the curl clients ---------------------------------------------------------------------------


def _tail(path: Path, size: int = 4096) -> bytes:
    with path.open("rb") as f:
        f.seek(max(0, path.stat().st_size - size))
        return f.read()


def wait_for_all(files: list[Path], marker: bytes, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    pending = list(files)
    while pending:
        pending = [f for f in pending if not (f.exists() and marker in _tail(f))]
        if pending and time.monotonic() > deadline:
            raise SystemExit(f"{len(pending)} curl client(s) never saw {marker.decode()}")
        time.sleep(0.05)


def curl_clients(
    workdir: Path, url: str, token: str, sid: str, subscribers: int
) -> tuple[list[subprocess.Popen[bytes]], list[Path]]:
    files = [workdir / f"curl-{i}.sse" for i in range(subscribers)]
    auth = f"Authorization: Bearer {token}"
    events = f"{url}/v1/sessions/{sid}/events"
    children = [subprocess.Popen(["curl", "-sN", "-H", auth, "-o", str(f), events]) for f in files]
    wait_for_all(files, b"event: SessionCreated", 60)  # subscribed: the replay came
    time.sleep(0.5)
    return children, files


# -- the measurement -------------------------------------------------------------------------


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def _stage(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50_ms": None, "p99_ms": None, "mean_ms": None}
    ms = [v * 1000 for v in values]
    return {"p50_ms": _pct(ms, 0.5), "p99_ms": _pct(ms, 0.99), "mean_ms": sum(ms) / len(ms)}


def probed_deliveries(probe: dict[str, Any]) -> list[Delivery]:
    """Every (connection, record) the daemon wrote, for clients that time nothing."""
    at = {int(s): t for s, t in probe["at"].items()}
    return [
        (int(port), seq, at[seq], None)
        for port, stamps in probe["written"].items()
        for seq, _ in stamps
        if seq in at
    ]


def stages(deliveries: list[Delivery], probe: dict[str, Any]) -> dict[str, Any]:
    """Split every delivery at the daemon's stamps (see ``bench/sse_probe.py``)."""
    durable = {int(s): t for s, t in probe["durable"].items()}
    published = {int(s): t for s, t in probe["published"].items()}

    def per_connection(name: str) -> dict[tuple[int, int], float]:
        out: dict[tuple[int, int], float] = {}
        for port, stamps in probe[name].items():
            for seq, t in stamps:
                out.setdefault((int(port), seq), t)
        return out

    handed, written = per_connection("handed"), per_connection("written")
    split: dict[str, list[float]] = {
        "commit": [],  # decision -> durable (writer thread)
        "handoff": [],  # durable -> the trio thread publishes it on the bus
        "fanout": [],  # bus -> this client's response hands the frame to ASGI send
        "http": [],  # ASGI send -> the bytes go into this client's socket
        "daemon": [],  # decision -> bytes into this client's socket
        "streaming": [],  # durable -> bytes into this client's socket (daemon minus commit)
        "client": [],  # socket -> the client has the frame parsed
    }
    for port, seq, at, arrived in deliveries:
        key = (port, seq)
        if seq not in durable or seq not in published or key not in handed or key not in written:
            continue
        split["commit"].append(durable[seq] - at)
        split["handoff"].append(published[seq] - durable[seq])
        split["fanout"].append(handed[key] - published[seq])
        split["http"].append(written[key] - handed[key])
        split["daemon"].append(written[key] - at)
        split["streaming"].append(written[key] - durable[seq])
        if arrived is not None:
            split["client"].append(arrived - written[key])
    out: dict[str, Any] = {"joined": len(split["daemon"])}
    out |= {name: _stage(values) for name, values in split.items()}
    return out


def cpu_seconds(pid: int) -> float:
    """User + system CPU of process ``pid`` so far (Linux /proc), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(
    workdir: Path, subscribers: int, k: int, procs: int, curl: bool, probe: bool
) -> dict[str, Any]:
    probe_file = workdir / "probe.json" if probe else None
    daemon, url, token = start_daemon(workdir, k, probe_file)
    children: list[subprocess.Popen[Any]] = []
    deliveries: list[Delivery] = []
    try:
        headers = {"Authorization": f"Bearer {token}"}
        with httpx.Client(base_url=url, headers=headers, timeout=60) as http:
            sid = http.post("/v1/sessions", json={"session_id": "sse"}).json()["session_id"]
            if curl:
                children, files = curl_clients(workdir, url, token, sid, subscribers)
            else:
                children = python_clients(url, token, sid, subscribers, procs)
            cpu_before = cpu_seconds(daemon.pid)
            body = {"text": "go", "request_id": "bench"}
            resp = http.post(f"/v1/sessions/{sid}/messages", json=body)
            assert resp.status_code == 202, resp.text
            if curl:
                wait_for_all(files, b"event: RunFinished", 300)
            else:
                for c in children:
                    out, _ = c.communicate(timeout=300)
                    if c.returncode != 0:
                        raise SystemExit(f"an SSE client process exited {c.returncode}")
                    deliveries += [tuple(d) for d in json.loads(out.strip().splitlines()[-1])]
            daemon_cpu = cpu_seconds(daemon.pid) - cpu_before
    finally:
        for c in children:
            if c.poll() is None:
                c.kill()
                c.wait()
        daemon.terminate()
        daemon.wait(30)
    probed = json.loads(probe_file.read_text()) if probe_file is not None else None
    if curl and probed is not None:
        deliveries = probed_deliveries(probed)
    delays = [arrived - at for _, _, at, arrived in deliveries if arrived is not None]
    result: dict[str, Any] = {
        "subscribers": subscribers,
        "clients": "curl" if curl else "python",
        "procs": subscribers if curl else procs,
        "k": k,
        "probe": probe,
        "deliveries": len(deliveries),
        **_stage(delays),
        # the daemon's CPU (every thread) from the message to the last client's end
        "daemon_cpu_us_per_delivery": daemon_cpu / max(1, len(deliveries)) * 1e6,
        "measure": "record decision -> SSE client (commit + fan-out + HTTP + client)",
    }
    if probed is not None:
        result["stages"] = stages(deliveries, probed)
    return result


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] == "clients":
        url, token, sid, count = args[1:5]
        got = trio.run(clients, url, token, sid, int(count))
        print(json.dumps(got))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("workdir", type=Path)
    parser.add_argument("subscribers", type=int)
    parser.add_argument("k", type=int)
    parser.add_argument("--procs", type=int, default=1, help="Python client processes")
    parser.add_argument("--curl", action="store_true", help="one curl process per client")
    parser.add_argument("--probe", action="store_true", help="stamp the daemon's stages")
    opts = parser.parse_args(args)
    opts.workdir.mkdir(parents=True, exist_ok=True)
    if (opts.workdir / "log").exists():
        raise SystemExit(f"{opts.workdir} holds a log already: give an empty directory")
    if opts.curl and not opts.probe:
        raise SystemExit("--curl clients time nothing themselves: add --probe")
    result = measure(opts.workdir, opts.subscribers, opts.k, opts.procs, opts.curl, opts.probe)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
