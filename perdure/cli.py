"""The ``perdure`` command line."""

from __future__ import annotations

import click

STYLES: dict[str, dict[str, object]] = {
    "title": {"bold": True},
    "input": {"fg": "cyan"},
    "model": {"fg": "blue"},
    "tool": {"fg": "green"},
    "restart": {"fg": "magenta", "bold": True},
    "recovery": {"fg": "yellow"},
    "warning": {"fg": "red"},
    "outcome": {"fg": "green", "bold": True},
    "plain": {},
}


def echo(text: str, style: str = "plain") -> None:
    """Print with a style; colour only when writing to a terminal (click decides)."""
    click.secho(text, **STYLES.get(style, {}))  # type: ignore[arg-type]


@click.group()
@click.version_option(package_name="perdure")
def main() -> None:
    """perdure: a durable runtime for LLM agents."""


@main.command()
@click.option("--keep", is_flag=True, help="Keep the demo's log and workspace afterwards.")
def demo(keep: bool) -> None:
    """Crash an agent right after a side effect, recover it, and show the timeline."""
    from perdure import demo as demo_module

    raise SystemExit(demo_module.main(echo, keep=keep))


if __name__ == "__main__":
    main()
