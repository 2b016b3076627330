"""Long sessions with context compaction: request size and compaction cost per turn.

Run from the repository root: ``python bench/compaction.py [--turns 500] [--window 4000]``.

One session of ``--turns`` inputs per vendor (the fake Anthropic Messages API and
OpenAI's Responses API of ``tests/``, through the real SDKs, on a real LMDB log), with
a context window of ``--window`` tokens. The fake servers report each request's size
(a quarter of its JSON characters) as its input tokens, and every reply answers at
length, so the conversation outgrows the window many times. Figures per vendor: the
request size per turn (bytes: the first turn, the largest, the median and the largest
after the first compaction), the compactions (how many, every how many turns, the
summary call's input and output tokens and seconds, the tokens before and after), and
the seconds per turn overall. It prints a table and writes
``bench/results/compaction.json`` (``compaction-quick.json`` with ``--quick``: 60
turns, a check that it works, not a measurement).
"""

from __future__ import annotations

import argparse
import itertools
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from perdure.providers.anthropic import AnthropicProvider  # noqa: E402
from perdure.providers.openai import OpenAIProvider  # noqa: E402
from tests import fake_anthropic as fa  # noqa: E402
from tests import fake_openai as fo  # noqa: E402
from tests.providers.conftest import openai_client, sdk_client  # noqa: E402
from tests.providers.long_session import ANSWER, Figures, run_long_session  # noqa: E402


def summary(figures: Figures) -> dict[str, Any]:
    sizes = figures.request_bytes
    comps = figures.compactions
    first = comps[0]["turn"] if comps else len(sizes)
    turns = [c["turn"] for c in comps]
    return {
        "turns": figures.turns,
        "completed": figures.completed,
        "seconds_per_turn": round(figures.seconds / figures.turns, 4),
        "request_bytes": {
            "first": sizes[0],
            "max": max(sizes),
            "median": statistics.median(sizes),
            "max_after_first_compaction": max(sizes[first + 1 :], default=0),
            "per_turn": sizes,
        },
        "compactions": {
            "count": len(comps),
            "every_turns": round(statistics.mean(b - a for a, b in itertools.pairwise(turns)), 1)
            if len(turns) > 1
            else None,
            "summary_input_tokens_median": statistics.median(
                c["summary_input_tokens"] for c in comps
            )
            if comps
            else None,
            "summary_output_tokens_median": statistics.median(
                c["summary_output_tokens"] for c in comps
            )
            if comps
            else None,
            "seconds_median": statistics.median(c["seconds"] for c in comps) if comps else None,
            "tokens_before_median": statistics.median(c["tokens_before"] for c in comps)
            if comps
            else None,
            "tokens_after_median": statistics.median(c["tokens_after"] for c in comps)
            if comps
            else None,
            "each": comps,
        },
    }


async def one(vendor: str, turns: int, window: int, work: Path) -> dict[str, Any]:
    if vendor == "anthropic":
        with fa.FakeAnthropic(default=fa.Reply(content=[fa.Text(ANSWER)])) as fake:
            fake.measure_input = True
            async with sdk_client(fake.url) as client:
                provider = AnthropicProvider(model="claude-test", max_tokens=1024, client=client)
                return summary(await run_long_session(work / vendor, provider, fake, turns, window))
    with fo.FakeOpenAI(default=fo.Reply(content=[fo.Text(ANSWER)])) as oa:
        oa.measure_input = True
        async with openai_client(oa.url) as client:
            provider_oa = OpenAIProvider(model="gpt-test", client=client, api="responses")
            return summary(await run_long_session(work / vendor, provider_oa, oa, turns, window))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--turns", type=int, default=500)
    parser.add_argument("--window", type=int, default=4000)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    turns = 60 if args.quick else args.turns
    results: dict[str, Any] = {
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": platform.platform(),
        "python": platform.python_version(),
        "window": args.window,
    }
    with tempfile.TemporaryDirectory() as tmp:
        for vendor in ("anthropic", "openai"):
            results[vendor] = trio.run(one, vendor, turns, args.window, Path(tmp))
    name = "compaction-quick.json" if args.quick else "compaction.json"
    out = ROOT / "bench" / "results" / name
    out.write_text(json.dumps(results, indent=1))
    print(
        f"{'vendor':<10} {'turns':>5} {'first B':>8} {'max B':>7} {'after B':>8} "
        f"{'compactions':>11} {'every':>6} {'sum in':>7} {'sum out':>7} {'s/turn':>7}"
    )
    for vendor in ("anthropic", "openai"):
        r = results[vendor]
        b, c = r["request_bytes"], r["compactions"]
        print(
            f"{vendor:<10} {r['turns']:>5} {b['first']:>8} {b['max']:>7} "
            f"{b['max_after_first_compaction']:>8} {c['count']:>11} {c['every_turns']!s:>6} "
            f"{c['summary_input_tokens_median']!s:>7} {c['summary_output_tokens_median']!s:>7} "
            f"{r['seconds_per_turn']:>7}"
        )
    print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
