"""Benchmarks of perdure against the physical floor and against LangGraph and DBOS.

Run ``python bench/run.py`` (or ``--quick``); see ``bench/README.md``.
"""
