"""The tools of the client tests' second daemon: a call with a compensation, and one
that waits for a person (``--tools tests.client.tools:TOOLS``)."""

from tests.failures.tools import charge_card
from tests.support.ledger_tools import open_ticket

TOOLS = [open_ticket, charge_card]

SCRIPT = [
    {
        "text": "Opening a ticket and charging the card.",
        "tool_uses": [
            {"name": "open_ticket", "input": {"title": "refund"}},
            {"name": "charge_card", "input": {"cents": 500}},
        ],
    },
    {"text": "Ticket open and card charged."},
]
