"""Per-tenant rate quotas: token buckets in the ledger database or in Redis."""

from quotagate.rate.backend import RateStore, Take
from quotagate.rate.keys import DEFAULT_TENANT, BucketKey, redis_key
from quotagate.rate.quotas import RateQuotas
from quotagate.rate.stores import rate_store_from_url, register

__all__ = [
    "DEFAULT_TENANT",
    "BucketKey",
    "RateQuotas",
    "RateStore",
    "Take",
    "rate_store_from_url",
    "redis_key",
    "register",
]
