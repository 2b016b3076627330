"""schemathesis hooks for the property-based run against a live daemon (test_schemathesis).

An event stream follows the session live until the client leaves; a generated
request would wait on it until its timeout. Every events request of the run asks
for the replay only (``live=0``), which is the same response without its endless tail.
"""

from __future__ import annotations

from typing import Any

import schemathesis


@schemathesis.hook
def before_call(context: Any, case: Any, kwargs: dict[str, Any]) -> None:
    if case.operation.path.endswith("/events") and case.method.upper() == "GET":
        query = dict(case.query or {})
        query["live"] = "0"
        case.query = query
