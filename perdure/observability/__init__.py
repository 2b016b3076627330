"""Observability: OpenTelemetry traces and metrics, Prometheus exposition, structured logs.

Nothing here is imported by ``import perdure``; the optional libraries are imported
only by the modules that need them (``tracing``: ``opentelemetry-api``, the
``perdure[otel]`` extra; ``metrics``: ``prometheus-client``). See README
"Observability".
"""
