"""Delivery of admitted requests: the outbox dispatcher and its targets.

Kept free of imports so that ``quotagate.delivery.stats`` is cheap to reach
from the store; import ``quotagate.delivery.dispatcher`` for the worker.
"""
