"""The edges name no core insides even in their annotations.

The import-linter contracts (pyproject.toml, run by ``.ci/run``) leave out imports under
``if TYPE_CHECKING:``, since those load nothing. But an annotation that names the fold's
``SessionState`` still ties an edge to the core's insides: its code reads whatever that
type offers, and a change of the fold's dicts breaks it. The edges read the read model
(``perdure.view``) instead; this test holds them to it for the imports the contracts
leave out. Each exception is listed with its reason.
"""

from __future__ import annotations

import grimp

EDGES = (
    "perdure.embed",
    "perdure.server",
    "perdure.observability",
    "perdure.retention",
    "perdure.client",
)
INSIDES = ("perdure.actors", "perdure._runtime")
# None left: ``Runtime.state`` and ``AsyncioRuntime.state`` hand their function a
# ``perdure.SessionLookup`` (``perdure.actors.readmodel.StateLookup``), not the fold's state.
ANNOTATION_ONLY_EXCEPTIONS: dict[tuple[str, str], str] = {}


def _inside_imports(graph: grimp.ImportGraph) -> set[tuple[str, str]]:
    return {
        (module, imported)
        for module in graph.modules
        if module.startswith(EDGES)
        for imported in graph.find_modules_directly_imported_by(module)
        if imported.startswith(INSIDES)
    }


def test_no_edge_names_the_cores_insides_under_type_checking() -> None:
    every = _inside_imports(grimp.build_graph("perdure", cache_dir=None))
    at_run_time = _inside_imports(
        grimp.build_graph("perdure", exclude_type_checking_imports=True, cache_dir=None)
    )
    annotation_only = every - at_run_time
    unlisted = annotation_only - set(ANNOTATION_ONLY_EXCEPTIONS)
    assert not unlisted, f"edges import the core's insides for annotations: {sorted(unlisted)}"
    stale = set(ANNOTATION_ONLY_EXCEPTIONS) - annotation_only
    assert not stale, f"listed exceptions no longer needed: {sorted(stale)}"
