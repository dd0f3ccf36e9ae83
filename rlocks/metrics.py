"""OpenTelemetry metrics and spans of rlocks (the ``rlocks[otel]`` extra).

With ``opentelemetry-api`` installed, every primitive records to OpenTelemetry's global
``MeterProvider`` and ``TracerProvider``; without it, nothing is recorded and nothing is
imported. The metric names and attributes are listed in docs/metrics.md. :func:`configure`
turns the ``name`` attribute on (off by default: many names make many series) or points
rlocks at other providers.
"""

from ._engine.metrics import DURATION_BUCKETS, configure

__all__ = ["DURATION_BUCKETS", "configure"]
