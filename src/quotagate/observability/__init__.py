"""Prometheus metrics for one quotagate process (needs the ``server`` extra)."""

from quotagate.observability.metrics import Metrics

__all__ = ["Metrics"]
