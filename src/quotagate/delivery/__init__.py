"""Delivery of admitted requests: the outbox dispatcher and its targets.

Kept free of imports; import ``quotagate.delivery.dispatcher`` for the worker.
"""
