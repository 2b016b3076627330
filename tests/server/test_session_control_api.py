"""Session control at the edges: the daemon's ``POST .../forks`` and ``if_busy`` on
messages, and ``perdure fork``."""

from __future__ import annotations

from pathlib import Path

from tests.server.test_api import assert_error, new_session, submit
from tests.server.test_cli import perdure, write_script
from tests.support.daemon import LEDGER_TOOLS, Daemon, awaiting_approval, idle, wait_for


def test_fork_a_busy_session_at_its_last_turn_and_interrupt_the_source(
    api_daemon: Daemon,
) -> None:
    with api_daemon.client() as c:
        sid = new_session(c, if_busy="queue")
        submit(c, sid)
        wait_for(c, sid, awaiting_approval)  # turn 1's tools are done; deploy waits

        forks = f"/v1/sessions/{sid}/forks"
        made = c.post(forks, json={"request_id": "f1", "session_id": f"{sid}-alt"})
        assert made.status_code == 201, made.text
        body = made.json()
        assert body["source"] == sid and body["duplicate"] is False
        again = c.post(forks, json={"request_id": "f1", "session_id": f"{sid}-alt"})
        assert again.status_code == 200 and again.json()["position"] == body["position"]
        # The fork continues the run from the end of turn 1: it reaches the approval too.
        alt = wait_for(c, f"{sid}-alt", awaiting_approval)
        assert alt["forked_from"] == {"session_id": sid, "position": body["position"]}

        assert_error(c.post(forks, json={"request_id": "f2", "at": 1}), 409, "invalid_state")
        assert_error(c.post(forks, json={"request_id": "f3", "at": True}), 400, "invalid_field")
        assert_error(c.post(forks, json={"at": None}), 400, "missing_field", "request_id")
        assert_error(c.post("/v1/sessions/nope/forks", json={"request_id": "f4"}), 404, "not_found")

        messages = f"/v1/sessions/{sid}/messages"
        rejected = c.post(messages, json={"text": "now", "request_id": "m1", "if_busy": "reject"})
        assert_error(rejected, 409, "busy")
        bogus = c.post(messages, json={"text": "now", "request_id": "m2", "if_busy": "later"})
        assert_error(bogus, 400, "invalid_field", "if_busy")
        cut = c.post(messages, json={"text": "stop", "request_id": "m3", "if_busy": "interrupt"})
        assert cut.status_code == 202 and cut.json()["disposition"] == "interrupted"
        summary = wait_for(c, sid, idle)
        assert [r["status"] for r in summary["runs"]][-2:] == ["cancelled", "completed"]


def test_perdure_fork_on_the_command_line(tmp_path: Path) -> None:
    script = write_script(tmp_path / "s.json", [{"text": "first answer"}, {"text": "second"}])
    (tmp_path / "ws").mkdir()
    log = ["--log", str(tmp_path / "log")]
    common = ["--provider", f"scripted:{script}", "--tools", LEDGER_TOOLS, *log]
    proc = perdure("run", "hello", *common, "--workspace", str(tmp_path / "ws"), "--session", "s")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    made = perdure("fork", "s", "--at", "in1.r0", "--as", "alt", *common)
    assert made.returncode == 0, made.stderr
    assert made.stdout.startswith("session alt forked from s at record ")
    again = perdure("fork", "s", "--at", "in1.r0", "--as", "alt", *common)
    assert "already forked" in again.stdout
    wrong = perdure("fork", "s", "--at", "2", *common)
    assert wrong.returncode == 1 and "nearest valid points" in wrong.stderr
    assert perdure("check", *log).returncode == 0


def test_delete_a_finished_session_through_the_api(api_daemon: Daemon) -> None:
    with api_daemon.client() as c:
        sid = new_session(c)
        submit(c, sid)
        call = wait_for(c, sid, awaiting_approval)["pending_approvals"][0]["call_id"]
        assert_error(c.delete(f"/v1/sessions/{sid}"), 409, "busy")
        c.post(f"/v1/sessions/{sid}/approvals/{call}", json={"approved": True, "request_id": "a"})
        wait_for(c, sid, idle)
        gone = c.delete(f"/v1/sessions/{sid}")
        assert gone.status_code == 200, gone.text
        assert gone.json()["deleted"] is True and gone.json()["records"] > 5
        assert_error(c.get(f"/v1/sessions/{sid}"), 404, "not_found")
        assert_error(c.delete(f"/v1/sessions/{sid}"), 404, "not_found")
