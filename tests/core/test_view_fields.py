"""The read model hands the edges an input's id and time, and a run's cancel request.

``test_view.py`` compares most fields of each view with the fold's own record; these
are the ones it left unchecked: the frontends and the timeline name an input by its id
and place it by its time, and show a run whose cancel was asked for as cancelling.
"""

from __future__ import annotations

from perdure.actors import protocol
from perdure.actors.readmodel import StateLookup
from perdure.storage.records import InputAccepted
from tests.core.sim import COURSE_TOOLS, Session, only


def test_an_inputs_view_names_it_and_its_time_and_a_runs_view_its_cancel() -> None:
    s = Session(tools=COURSE_TOOLS)
    step, _ = s.command(protocol.Submit("r1", "go"))
    accepted = only(step.records, InputAccepted)[0]
    view = StateLookup(s.state).submission_view(accepted.submission_id)
    assert view is not None
    assert view.submission_id == accepted.submission_id != ""
    assert view.at == accepted.at

    run = s.state.run
    assert run is not None
    assert StateLookup(s.state).run_view(run.run_id).cancel_requested is False  # type: ignore[union-attr]
    s.command(protocol.Cancel("c1"))
    assert run.cancel_requested
    assert StateLookup(s.state).run_view(run.run_id).cancel_requested is True  # type: ignore[union-attr]
