"""Tools written for another agent framework, brought over with one decorator.

The functions below have the shape tools have in the OpenAI Agents SDK
(``@function_tool``) or Pydantic AI (``@agent.tool_plain``): typed with pydantic
models, Enums, datetimes and ``Annotated[..., Field(...)]``, documented with a
Google-style ``Args:`` section, one of them a plain ``def``. Nothing in them changes:
the only line perdure asks for is ``@perdure.tool(replay=...)``, the replay policy,
which those frameworks do not have (what may be run again after a crash).

Run it: ``python examples/bring_your_tools.py``. A scripted model calls each tool
once (one call with an argument the schema refuses); the script prints what the
model was shown and what it read back.
"""

from __future__ import annotations

import datetime
import enum
import json
from pathlib import Path
from typing import Annotated

import pydantic
import trio

import perdure
from perdure.providers import ScriptedProvider
from perdure.providers.base import ToolResultBlock
from perdure.providers.scripted import Reply, ToolUse

LOG = Path("bring-your-tools-log")


class Unit(enum.Enum):
    CELSIUS = "celsius"
    FAHRENHEIT = "fahrenheit"


class Location(pydantic.BaseModel):
    city: str
    country: Annotated[str, pydantic.Field(min_length=2, max_length=2)] = "FR"


Email = Annotated[str, pydantic.Field(pattern=r"^[^@\s]+@[^@\s]+$")]


class Forecast(pydantic.BaseModel):
    city: str
    day: datetime.date
    high: float
    unit: Unit


# -- as written for the other framework, plus one decorator ---------------------------------


@perdure.tool(replay=perdure.ReplayPolicy.SAFE)  # the one line perdure asks for
def get_forecast(
    location: Location,
    day: datetime.date,
    unit: Unit = Unit.CELSIUS,
) -> Forecast:
    """Get the weather forecast for a city.

    Args:
        location: the city, and its ISO country code.
        day: the day of the forecast.
        unit: the temperature unit.
    """
    high = 21.5 if unit is Unit.CELSIUS else 70.7
    return Forecast(city=location.city, day=day, high=high, unit=unit)


@perdure.tool(replay=perdure.ReplayPolicy.NEVER)  # it sends something: never re-run blindly
async def send_alert(
    message: Annotated[str, pydantic.Field(max_length=140, description="the text sent")],
    recipients: list[Email] | None = None,
) -> str:
    """Send a weather alert.

    Args:
        recipients: who receives it (everyone subscribed when left out).
    """
    await trio.sleep(0.001)  # stands in for the call to the alerting service
    return f"sent to {len(recipients or [])} recipient(s) or everyone: {message}"


async def main() -> None:
    provider = ScriptedProvider(
        [
            Reply(
                tool_uses=[
                    ToolUse(
                        "get_forecast",
                        {"location": {"city": "Lyon"}, "day": "2026-03-01", "unit": "celsius"},
                    ),
                    ToolUse("send_alert", {"message": "Heat!", "recipients": ["not-an-email"]}),
                ]
            ),
            Reply(text="Forecast read; the alert needs valid addresses."),
        ]
    )
    async with perdure.open_runtime(LOG, provider=provider, tools=[get_forecast, send_alert]) as rt:
        for t in (get_forecast, send_alert):
            print(f"{t.name}: {t.description}")
            print("  parameters:", json.dumps(t.input_schema["properties"]))
        sid = await rt.create_session()
        await rt.submit(sid, "Forecast for Lyon, and alert people.")
        outcome = await rt.wait_idle(sid)
        for message in await rt.transcript(sid):
            for block in message.content:
                if isinstance(block, ToolResultBlock):
                    print(f"model read ({'error' if block.is_error else 'ok'}): {block.content}")
        assert outcome is not None
        print("run:", outcome.status)


if __name__ == "__main__":
    trio.run(main)
