"""``perdure cancel | approve | deny | resolve | pause | resume | revise``, as a person runs
them: against a live ``perdure serve`` (found from the log's directory, or by --url),
against a log no process owns (recorded there; the next daemon acts on it), and
against what goes wrong (no such session or call, a daemon that is gone, a log owned
by a process with no daemon, a read-only log): one line each, a documented exit
status, no traceback, nothing written.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.daemon import ROOT, Daemon, idle, wait_for
from tests.support.ledger_tools import effects

TOOLS = "tests.support.person_tools:TOOLS"

# Every session: a deploy that needs approval, a charge that needs a person, an answer.
SCRIPT: list[dict[str, Any]] = [
    {"text": "Deploying first.", "tool_uses": [{"name": "deploy", "input": {"target": "prod"}}]},
    {"text": "Now charging.", "tool_uses": [{"name": "charge", "input": {"amount": 5}}]},
    {"text": "Deployed and charged."},
]

# A NEVER call that is still running when the daemon is killed.
SLOW_SCRIPT: list[dict[str, Any]] = [
    {
        "text": "Announcing.",
        "tool_uses": [{"name": "slow_announce", "input": {"text": "hi", "seconds": 30}}],
    },
    {"text": "Announced."},
]


def person(*args: str, log: Path | str, env: dict[str, str] | None = None) -> Any:
    """Run ``perdure ARGS --log LOG`` as a person would, and check its output's shape:
    exactly one line, on stdout when it worked and on stderr when it did not."""
    full = dict(os.environ)
    full.pop("PERDURE_TOKEN", None)
    full["PYTHONPATH"] = str(ROOT)
    full.update(env or {})
    done = subprocess.run(
        [sys.executable, "-m", "perdure.cli", *args, "--log", str(log)],
        cwd=ROOT,
        env=full,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "Traceback" not in done.stderr, done.stderr
    said = done.stdout if done.returncode == 0 else done.stderr
    assert len(said.splitlines()) == 1, (done.returncode, done.stdout, done.stderr)
    assert (done.stderr if done.returncode == 0 else done.stdout) == ""
    done.line = said.strip()
    return done


def said(done: Any, code: int, *parts: str) -> str:
    assert done.returncode == code, (done.returncode, done.stdout, done.stderr)
    for part in parts:
        assert part in done.line, (part, done.line)
    return str(done.line)


def start(http: httpx.Client, sid: str) -> None:
    assert http.post("/v1/sessions", json={"session_id": sid}).status_code in (200, 201)
    resp = http.post(
        f"/v1/sessions/{sid}/messages", json={"text": "Deploy and charge", "request_id": sid}
    )
    assert resp.status_code in (200, 202), resp.text


def pending_approval(http: httpx.Client, sid: str) -> str:
    summary = wait_for(http, sid, lambda s: bool(s["pending_approvals"]))
    return str(summary["pending_approvals"][0]["call_id"])


def awaiting_person(http: httpx.Client, sid: str) -> str:
    summary = wait_for(http, sid, lambda s: bool(s["awaiting_resolution"]))
    return str(summary["awaiting_resolution"][0]["call_id"])


def last_run(http: httpx.Client, sid: str) -> dict[str, Any]:
    summary = wait_for(http, sid, idle)
    return dict(summary["runs"][-1])


@pytest.fixture
def daemon(make_daemon: Callable[..., Daemon]) -> Daemon:
    return make_daemon(SCRIPT, tools=TOOLS).start()


def test_each_command_through_a_live_daemon(daemon: Daemon, tmp_path: Path) -> None:
    log = daemon.log
    address = json.loads((log / "daemon.json").read_text())
    assert address == {"url": daemon.url, "pid": daemon.pid}
    via = f"the daemon at {daemon.url}"
    with daemon.client() as http:
        for sid in ("a", "b", "c"):
            start(http, sid)
        deploy_a = pending_approval(http, "a")

        said(person("pause", "a", log=log), 0, "session a: paused", via)
        assert http.get("/v1/sessions/a").json()["paused"] is True
        said(person("pause", "a", log=log), 0, "session a: already paused")
        said(person("resume", "a", log=log), 0, "session a: resumed", via)
        said(person("resume", "a", log=log), 0, "not paused, nothing to resume")

        said(person("approve", "a", deploy_a, log=log), 0, f"call {deploy_a} approved", via)
        # The same command again is the same request: answered, not recorded twice.
        said(person("approve", "a", deploy_a, log=log), 0, "already done by an earlier approve")
        charge_a = awaiting_person(http, "a")
        said(person("resolve", "a", charge_a, "retry", log=log), 0, "resolved: retry")
        assert last_run(http, "a")["status"] == "completed"

        # A revision of a run, then its cancellation.
        pending_approval(http, "b")
        said(person("revise", "b", "Deploy to staging", log=log), 0, "request revised (revision 1)")
        assert http.get("/v1/sessions/b").json()["request"]["text"] == "Deploy to staging"
        run_b = http.get("/v1/sessions/b").json()["current_run"]
        said(person("cancel", "b", "--request-id", "stop-b", log=log), 0, f"cancel of run {run_b}")
        said(
            person("cancel", "b", "--request-id", "stop-b", log=log),
            0,
            "already done by an earlier cancel with request id stop-b",
        )
        assert last_run(http, "b")["status"] == "cancelled"

        # A denial (with a note), and a call a person fails: the model is told both.
        deploy_c = pending_approval(http, "c")
        said(person("deny", "c", deploy_c, "--note", "not today", log=log), 0, "denied")
        charge_c = awaiting_person(http, "c")
        said(
            person("resolve", "c", charge_c, "fail", "--result", "no card", log=log),
            0,
            "resolved: fail",
        )
        assert last_run(http, "c")["status"] == "completed"

        # --url and --token-file instead of the log's own files.
        token = tmp_path / "token"
        token.write_text(daemon.token + "\n")
        said(
            person("pause", "c", "--url", daemon.url, "--token-file", str(token), log="/nowhere"),
            0,
            "session c: paused",
            via,
        )

        # What goes wrong says so in one line.
        said(person("approve", "nosuch", "c1", log=log), 1, "nosuch", "no session")
        said(person("approve", "a", "nocall", log=log), 1, "no tool call 'nocall'")
        said(person("deny", "a", deploy_a, log=log), 1, "not awaiting approval")
        wrong = tmp_path / "wrong"
        wrong.write_text("not-the-token")
        said(
            person("pause", "a", "--url", daemon.url, "--token-file", str(wrong), log=log),
            1,
            "refused the token",
        )

    ws = daemon.workspace
    assert [e["tool"] for e in effects(ws)] == ["deploy", "charge"]  # a's, once each
    assert daemon.stop() == 0
    assert not (log / "daemon.json").exists()  # the address leaves with the daemon


def test_each_command_on_a_log_no_process_owns(daemon: Daemon) -> None:
    log = daemon.log
    with daemon.client() as http:
        for sid in ("a", "b", "c"):
            start(http, sid)
        deploy_a = pending_approval(http, "a")
        pending_approval(http, "b")
        deploy_c = pending_approval(http, "c")
    assert daemon.stop() == 0

    here = f"the log {log}"
    later = "nothing runs now: the next process to open the log carries it out"
    said(person("pause", "a", log=log), 0, "session a: paused", here, later)
    said(person("pause", "a", log=log), 0, "already paused")
    said(person("resume", "a", log=log), 0, "session a: resumed", here)
    said(person("approve", "a", deploy_a, log=log), 0, f"call {deploy_a} approved", here, later)
    said(person("approve", "a", deploy_a, log=log), 0, "already done by an earlier approve")
    said(person("revise", "b", "Deploy to staging", log=log), 0, "revision 1", here)
    said(person("deny", "c", deploy_c, "--note", "not today", log=log), 0, "denied", here)
    said(person("approve", "nosuch", "c1", log=log), 1, "no session 'nosuch'")
    said(person("approve", "a", "nocall", log=log), 1, "no tool call 'nocall'")
    assert effects(daemon.workspace) == []  # recorded only: nothing ran

    daemon.restart()  # the next owner acts on what was recorded
    with daemon.client() as http:
        charge_a = awaiting_person(http, "a")
        awaiting_person(http, "b")  # its revised request's next turn
        charge_c = awaiting_person(http, "c")
        assert http.get("/v1/sessions/b").json()["request"]["text"] == "Deploy to staging"
    assert [e["tool"] for e in effects(daemon.workspace)] == ["deploy"]  # a's: approved
    assert daemon.stop() == 0

    said(person("resolve", "a", charge_a, "retry", log=log), 0, "resolved: retry", here)
    said(person("cancel", "b", log=log), 0, "cancel of run", here)
    said(person("cancel", "b", log=log), 0, "already done by an earlier cancel")
    said(person("resolve", "c", charge_c, "skip", "--result", '"paid in cash"', log=log), 0, "skip")

    daemon.restart()
    with daemon.client() as http:
        assert last_run(http, "a")["status"] == "completed"
        assert last_run(http, "b")["status"] == "cancelled"
        assert last_run(http, "c")["status"] == "completed"
        outputs = {t["call_id"]: t["result"] for t in http.get("/v1/sessions/c").json()["tasks"]}
        assert "paid in cash" in json.dumps(outputs[charge_c])
    assert [e["tool"] for e in effects(daemon.workspace)] == ["deploy", "charge"]
    assert daemon.stop() == 0
    check = subprocess.run(
        [sys.executable, "-m", "perdure.cli", "check", "--log", str(log), "--settled"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert check.returncode == 0, check.stdout + check.stderr


def test_a_cancel_recorded_after_a_crash_finishes_the_run_instead_of_resuming_it(
    make_daemon: Callable[..., Daemon],
) -> None:
    daemon = make_daemon(SLOW_SCRIPT, tools=TOOLS).start()
    with daemon.client() as http:
        start(http, "s")
        wait_for(http, "s", lambda s: any(t["phase"] == "executing" for t in s["tasks"]))
    daemon.kill()  # mid-call: its address file stays behind, naming a dead process
    assert (daemon.log / "daemon.json").exists()

    said(person("cancel", "s", log=daemon.log), 0, "cancel of run", f"the log {daemon.log}")

    daemon.restart()
    with daemon.client() as http:
        run = last_run(http, "s")
        summary = http.get("/v1/sessions/s").json()
    assert run["status"] == "cancelled"
    assert [r["status"] for r in summary["runs"]] == ["cancelled"]  # never resumed
    (task,) = summary["tasks"]
    assert task["phase"] == "outcome_unknown"  # never re-run blindly
    assert any(d["action"] == "finish cancelling" for d in summary["decisions"])
    assert effects(daemon.workspace) == []


@pytest.fixture
def held_log(tmp_path: Path, make_daemon: Callable[..., Daemon]) -> Iterator[tuple[Path, int]]:
    """A log with a session, owned by a process that has no daemon (as ``perdure run``)."""
    daemon = make_daemon(SCRIPT, tools=TOOLS).start()
    with daemon.client() as http:
        start(http, "a")
        pending_approval(http, "a")
    assert daemon.stop() == 0
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from perdure.storage import open_log; "
            "log = open_log(sys.argv[1]); print('held', flush=True); time.sleep(120)",
            str(daemon.log),
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    yield daemon.log, holder.pid
    holder.kill()
    holder.wait(10)
    holder.stdout.close()


def test_nobody_to_deliver_to_is_one_line(held_log: tuple[Path, int], tmp_path: Path) -> None:
    log, holder = held_log
    before = (log / "data.mdb").read_bytes()
    said(
        person("approve", "a", "c1", log=log),
        1,
        f"is owned by pid {holder}",
        "no daemon to talk to",
    )
    # An address file whose process lives but does not answer (a dead port).
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}"
    (log / "daemon.json").write_text(json.dumps({"url": dead, "pid": holder}))
    (log / "daemon.token").write_text("t\n")
    said(person("pause", "a", log=log), 1, f"its daemon at {dead} does not answer")
    assert (log / "data.mdb").read_bytes() == before  # nothing was written

    said(
        person("pause", "a", "--url", dead, log=tmp_path, env={"PERDURE_TOKEN": "t"}),
        1,
        "cannot reach the daemon: ConnectError",
        f"({dead}): is it running?",
    )
    said(person("pause", "a", log=tmp_path / "none"), 2, "no perdure log here")
    said(person("resolve", "a", "c1", "retry", "--result", "x", log=log), 2, "--result")
    # An unknown outcome's words are the actions they mean: not-applied is a retry.
    said(person("resolve", "a", "c1", "not-applied", "--result", "x", log=log), 2, "a retry")


# -- the default request ids (pure) --------------------------------------------------------


def _summary(**fields: Any) -> dict[str, Any]:
    return {"current_run": "in1.r0", "last_seq": 10, "tasks": [], **fields}


def test_default_request_ids_follow_what_the_command_acts_on() -> None:
    from perdure._cli_control import Order

    def rid(summary: dict[str, Any], **order: Any) -> str:
        return Order(session_id="s", **order).with_request_id(summary)

    here = _summary()
    # The same command on the same thing: the same id (a second run is deduplicated).
    assert rid(here, kind="cancel") == rid(_summary(last_seq=99), kind="cancel")
    assert rid(here, kind="approve", call_id="c1") == rid(_summary(), kind="approve", call_id="c1")
    # Something new: a new request.
    assert rid(here, kind="cancel") != rid(_summary(current_run="in2.r0"), kind="cancel")
    assert rid(here, kind="approve", call_id="c1") != rid(here, kind="approve", call_id="c2")
    assert rid(here, kind="approve", call_id="c1") != rid(here, kind="deny", call_id="c1")
    assert rid(here, kind="revise", text="a") != rid(here, kind="revise", text="b")
    assert rid(here, kind="pause") != rid(_summary(last_seq=11), kind="pause")
    # A call that needs a person again (a later attempt) is a new resolution.
    first = _summary(tasks=[{"call_id": "c1", "attempt": 1}])
    second = _summary(tasks=[{"call_id": "c1", "attempt": 2}])
    assert rid(first, kind="resolve", call_id="c1") != rid(second, kind="resolve", call_id="c1")
    assert rid(first, kind="resolve", call_id="c1", action="skip", result="x") != rid(
        first, kind="resolve", call_id="c1", action="skip", result="y"
    )
    # Another session's identical command is another request; a given id is kept.
    assert rid(here, kind="pause") != Order(session_id="t", kind="pause").with_request_id(here)
    assert rid(here, kind="pause", request_id="mine") == "mine"
    assert rid(here, kind="cancel").startswith("person-cancel-")


# -- sub-agents, on a log no process owns ----------------------------------------------------


async def test_pause_and_resume_on_an_unowned_log_reach_the_running_sub_agents(
    tmp_path: Path,
) -> None:
    import trio

    import perdure
    from perdure._unowned import owning
    from perdure.actors import protocol
    from perdure.providers.scripted import Reply, ScriptedProvider, ToolUse
    from perdure.settings import Settings
    from perdure.tools.contract import registry
    from tests.runtime.test_agents import RESEARCHER, lookup, research

    log_dir = tmp_path / "log"
    script = ScriptedProvider(
        [Reply(text="asking", tool_uses=[ToolUse("research", {"task": "slow"})])],
        by_system={RESEARCHER: [Reply(text="thinking...", delay=30)]},
    )
    tools = [lookup, research]
    # The process stops while the parent's call waits for its child (as after a crash:
    # neither is finished).
    async with perdure.open_runtime(
        log_dir, provider=script, tools=tools, shutdown_grace=0.1
    ) as rt:
        await rt.create_session("p")
        await rt.submit("p", "go", request_id="r1")
        with trio.fail_after(20):
            while not await rt.children("p"):  # noqa: ASYNC110
                await trio.sleep(0.02)
        (child,) = await rt.children("p")

    async with owning(log_dir, registry(tools), settings=Settings()) as log:
        done = await log.apply(await log.state("p"), protocol.Pause("pz"))
        assert done.seq and not done.duplicate
        assert (await log.state("p")).paused
        assert (await log.state(child)).paused, "the pause reached the child"
        again = await log.apply(await log.state("p"), protocol.Pause("pz"))
        assert again.duplicate and again.seq == done.seq
        await log.apply(await log.state("p"), protocol.Resume("rz"))
        assert not (await log.state(child)).paused
