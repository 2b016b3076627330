"""``python bench/run.py --quick`` keeps working (CI checks the code, never the figures).

The peers (LangGraph, DBOS) live in their own virtual environment; where it is absent
(as in CI) the benchmark skips their parts and says why, and so does the peer test here.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def quick(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path, str]:
    out = tmp_path_factory.mktemp("bench-results")
    env = dict(os.environ)
    env.pop("PERDURE_FAULT", None)
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "run.py"), "--quick", "--out", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return json.loads((out / "quick.json").read_text()), out, proc.stdout


def _positive(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value) and value > 0


def test_quick_results_are_well_formed(quick: tuple[dict[str, Any], Path, str]) -> None:
    results, out, stdout = quick
    assert results["mode"] == "quick"
    assert results["date"] and results["machine"]["cpus"]
    assert results["versions"]["perdure"]["perdure"]
    cfg = results["config"]
    pt = results["per_turn"]
    assert _positive(pt["floor"]["median_ms"])
    for k in (cfg["k_small"], cfg["k_large"]):
        run = pt[f"perdure_k{k}"]
        assert _positive(run["median_ms"]) and _positive(run["last10_over_first10"])
        # perdure performs two synced commits per turn (plus a constant per run).
        assert 2 <= run["trials"][0]["commits_per_turn"] < 2.5
    assert _positive(results["breakdown"]["turn_ms"])
    # The actor skeleton commits the same records as perdure, through the same Journal.
    skeleton = pt[f"skeleton_k{cfg['k_small']}"]
    assert _positive(skeleton["median_ms"])
    assert 2 <= skeleton["trials"][0]["commits_per_turn"] < 2.5
    assert (
        skeleton["trials"][0]["records_per_turn"]
        == pt[f"perdure_k{cfg['k_small']}"]["trials"][0]["records"] / cfg["k_small"]
    )
    tracing = results["tracing"]  # on / off measured in the same run
    assert _positive(tracing["on_over_off_cpu"]) and _positive(tracing["noop_over_off_cpu"])
    assert _positive(tracing["traces_over_off_cpu"])
    assert tracing["on"]["spans"] == 2 * cfg["k_small"] + 2  # run, K + 1 chats, K tools
    assert tracing["off"]["spans"] == 0
    # The headline reading: every mode in one process, rotating (perdure_bench tracing-ab).
    ab = tracing["one_process"]
    assert ab["rounds"] == cfg["tracing_ab_rounds"]
    for mode in ("off", "noop", "traces", "on"):
        assert len(ab["cpu_ms_per_turn"][mode]) == ab["rounds"]
        assert all(_positive(x) for x in ab["cpu_ms_per_turn"][mode])
    for mode in ("noop", "traces", "on"):
        low, high = ab[f"{mode}_over_off_cpu_quartiles"]
        assert _positive(low) and low <= ab[f"{mode}_over_off_cpu"] <= high
    assert _positive(results["breakdown"]["commit_ms"])
    census = results["census"]["value_sizes"]
    assert [len(c) for c in census] == [3, 2]
    for sessions, k in cfg["concurrency"]:
        conc = results["concurrency"][f"perdure_{sessions}x{k}"]
        assert _positive(conc["turns_per_s"]) and conc["records_per_commit"] >= 1
    first = "{}x{}".format(*cfg["concurrency"][0])
    skel = results["concurrency"][f"skeleton_{first}"]
    bare = results["concurrency"][f"skeleton-nolog_{first}"]
    assert _positive(skel["cpu_ms_per_turn"]) and skel["records_per_commit"] >= 1
    assert _positive(bare["cpu_ms_per_turn"]) and bare["commits"] == 0
    busy = results["concurrency"]["busy_loop"]
    for part in ("quiet", "busy"):
        assert _positive(busy[part]["turns_per_s"]) and busy[part]["commits"] >= 1
        assert busy[part]["added_p99_ms"] >= busy[part]["added_p50_ms"]
    # The task ran beside the sessions. No upper bound: the share divides by a rate
    # measured alone minutes apart on a shared machine, so above 1 is noise, not a fault.
    assert 0 < busy["busy"]["spinner_share_kept"] < float("inf")
    rec = results["recovery"]
    for name in ("without", "with_finished"):
        assert rec[name]["recovered_sessions"] == cfg["interrupted_sessions"]
        assert _positive(rec[name]["last_rerun_ms"]) and _positive(rec[name]["peak_rss_mib"])
    memory = results["memory"]
    assert _positive(memory["kib_per_idle_session"])
    # Measured once the heap was given back after the last freezing round.
    assert memory["heap_trims"] >= 1
    # The same with PYTHONMALLOC=malloc, and that setting's CPU cost at the largest size.
    assert _positive(memory["malloc"]["kib_per_idle_session"])
    assert memory["malloc"]["heap_trims"] >= 1
    largest = "{}x{}".format(*cfg["concurrency"][-1])
    assert _positive(results["concurrency"][f"perdure-malloc_{largest}"]["cpu_ms_per_turn"])
    streams = [v for key, v in results["streaming"].items() if key != "sse"]
    assert streams and all(s["deliveries"] > 0 and _positive(s["p99_ms"]) for s in streams)
    sse = results["streaming"]["sse"]
    assert sse["deliveries"] > 0
    assert _positive(sse["p50_ms"])
    assert sse["p99_ms"] >= sse["p50_ms"]
    # The probed variants split each delivery: the daemon's share and the client's.
    probed = sse["split"]["python"]
    # every delivery a client timed is matched with the daemon's stamps for it
    assert probed["deliveries"] == sse["deliveries"] == probed["trials"][0]["stages"]["joined"]
    stages = probed["stages"]
    for stage in ("commit", "fanout", "http", "daemon", "streaming", "client"):
        assert stages[stage]["p50_ms"] is not None and stages[stage]["p50_ms"] >= 0, stage
    assert stages["daemon"]["p50_ms"] >= stages["streaming"]["p50_ms"]
    assert sse["split"]["one_client"]["subscribers"] == 1
    curl = sse["split"]["curl"]
    assert "skipped" in curl or _positive(curl["stages"]["daemon"]["p50_ms"])
    floor = sse["floor"]  # bare Hypercorn and perdure's app, one event at a time
    if "skipped" not in floor:
        for server in ("hypercorn", "perdure"):
            f = floor[server]
            assert 0 < f["first_client_ms"] <= f["median_client_ms"] <= f["last_client_ms"]
            assert _positive(f["cpu_us_per_write"])
    # Time to first token: perdure serve and a bare server, the same model, interleaved.
    ft = results["first_token"]
    trials, think_ms = cfg["first_token"]
    assert ft["trials"] == trials and ft["think_ms"] == think_ms
    for arm in ("perdure", "bare"):
        assert len(ft[arm]["trials_ms"]) == trials  # the warm-up trials are not counted
        assert all(_positive(v) for v in ft[arm]["trials_ms"])  # arrived after it was written
        assert ft[arm]["min_ms"] <= ft[arm]["p50_ms"] <= ft[arm]["p99_ms"]
    assert ft["p50_ratio"] == ft["perdure"]["p50_ms"] / ft["bare"]["p50_ms"]
    assert len(ft["loadavg_before"]) == 3
    ratios = {r["ratio"]: r for r in results["ratios"]}
    (first_token,) = [r for n, r in ratios.items() if n.startswith("time from the model's first")]
    assert first_token["value"] == ft["p50_ratio"] and first_token["met"] is None
    assert any(name.startswith("perdure per turn / floor") for name in ratios)
    assert all(r["met"] in (True, False, None) for r in ratios.values())
    (share,) = [r for name, r in ratios.items() if name.startswith("daemon share of SSE p50")]
    assert share["met"] in (True, False) and _positive(share["value"])
    pg = results["postgres"]
    if "skipped" not in pg:  # PostgreSQL can be started here: its figures are well formed
        for backend in ("lmdb", "postgres"):
            assert _positive(pg["figures"][backend]["ms_per_turn"])
        assert pg["figures"]["postgres"]["runs_per_s_by_nodes"]
    summary = (out / "summary-quick.md").read_text()
    assert "### PostgreSQL backend" in summary
    assert "### Ratios and targets" in summary
    assert "- A busy loop (" in summary
    # The tracing target's rows read the one-process measurement, beside its control.
    (tracing_row,) = [n for n in ratios if n.startswith("CPU per turn, tracing on: SDK")]
    assert "one process, 1 rounds" in tracing_row and ratios[tracing_row]["met"] in (True, False)
    assert "the control, the same way" in summary
    assert "- Time to first token at the browser (`bench/first_token.py`" in summary
    assert "### Ratios and targets" in stdout


def test_quick_peers(quick: tuple[dict[str, Any], Path, str]) -> None:
    results, _, _ = quick
    if results["peers"] != "ok":
        pytest.skip(f"peer parts skipped: {results['peers']}")
    cfg = results["config"]
    for peer in ("langgraph", "dbos"):
        run = results["per_turn"][f"{peer}_k{cfg['k_small']}"]
        assert "error" not in run, run
        assert _positive(run["median_ms"])
        for sessions, k in cfg["concurrency"]:
            assert _positive(results["concurrency"][f"{peer}_{sessions}x{k}"]["turns_per_s"])
    assert results["versions"]["peers"]["langgraph"] and results["versions"]["peers"]["dbos"]


def test_quick_results_measure_the_asyncio_embedding(
    quick: tuple[dict[str, Any], Path, str],
) -> None:
    results, _, stdout = quick
    em = results["embedding"]
    for way in ("trio", "thread", "guest"):
        assert all(_positive(em[f"{way}_us"][kind]) for kind in ("state", "session_info"))
    assert _positive(em["thread_ratio"]["state"]) and _positive(em["guest_ratio"]["state"])
    assert "through `perdure.embed`" in stdout
