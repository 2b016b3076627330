"""Observability: OpenTelemetry traces and metrics, Prometheus exposition, structured logs.

* ``hooks``: the seam (commit observers, transaction observers) and ``traceparent``
  checks; imports nothing optional.
* ``tracing``: GenAI spans and client metrics through the application's
  OpenTelemetry providers (``opentelemetry-api``, the ``perdure[otel]`` extra).
* ``metrics``: the daemon's Prometheus metrics (``prometheus-client``, ``perdure[metrics]``).
* ``logs``: the ``perdure.*`` loggers' ids and JSON lines.

Nothing here is imported by ``import perdure`` except ``hooks`` and ``logs`` (standard
library only); the optional libraries are imported only by the modules that need
them. See docs/OBSERVABILITY.md.
"""
