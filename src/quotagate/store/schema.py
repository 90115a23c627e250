"""The one schema, shared by every SQL engine (SQLAlchemy Core).

Times the application decides (submission, aging, TTL) are epoch seconds as
doubles, taken from the injectable clock. Times that must be judged by the
database's own clock (lease expiry, bucket refill) are also epoch seconds, but
computed in SQL by :mod:`quotagate.store.dialect`.
"""

from __future__ import annotations

import sqlalchemy as sa

metadata = sa.MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)

NAME = sa.String(63)
REQUEST_ID = sa.String(128)
RESOURCE = sa.String(32)
TIME: sa.Double[float] = sa.Double()

tenant = sa.Table(
    "qg_tenant",
    metadata,
    sa.Column("name", NAME, primary_key=True),
    sa.Column("created", TIME, nullable=False),
    # The cohort the tenant lends to and borrows from (docs/fair-sharing.md); NULL: none.
    sa.Column("cohort", NAME, nullable=True),
    # Its weight in fair sharing between tenants.
    sa.Column("weight", sa.Integer, nullable=False, server_default="1"),
    # The highest priority its requests may ask for (NULL: no cap).
    sa.Column("max_priority", sa.Integer, nullable=True),
    # Preemption policies (docs/fair-sharing.md#preemption): take borrowed work
    # back from other members (never | lower-priority | any), and stop its own
    # lower-priority work for a waiting request (never | lower-priority).
    sa.Column("reclaim", sa.String(16), nullable=False, server_default="never"),
    sa.Column("within_tenant", sa.String(16), nullable=False, server_default="never"),
    # The max-runtime (seconds) its requests reserve against budgets when they
    # declare none (docs/fair-sharing.md#budgets); NULL: none.
    sa.Column("default_max_runtime", sa.BigInteger, nullable=True),
    # What a confirmed preemption does to its victim: fail (ends ``preempted``) or
    # requeue (back to ``waiting`` with its submission time, docs/decisions/720).
    sa.Column("on_preempt", sa.String(16), nullable=False, server_default="fail"),
    # Stop its running work once its max-runtime has passed since admission
    # (docs/decisions/714); false: overruns keep running and accrue (711).
    sa.Column("stop_at_max_runtime", sa.Boolean, nullable=False, server_default=sa.false()),
    # Seconds past the max-runtime before that stop begins (docs/decisions/715); 0: none.
    sa.Column("max_runtime_grace", sa.Integer, nullable=False, server_default="0"),
    # Workers look for overruns from the few tenants that opt in, every pass.
    sa.Index(None, "stop_at_max_runtime"),
)

# Cohorts form trees (parent NULL: a root). Each tree is one sharing domain.
cohort = sa.Table(
    "qg_cohort",
    metadata,
    sa.Column("name", NAME, primary_key=True),
    sa.Column("parent", NAME, nullable=True),
    sa.Column("created", TIME, nullable=False),
)

# The shared room of a root cohort per resource: ``cap`` is the sum of its
# members' lendable nominal, ``used`` the sum of what each uses above its own
# guaranteed part (quotagate.domain.sharing). Charged by admission like a pool row.
cohort_usage = sa.Table(
    "qg_cohort_usage",
    metadata,
    sa.Column("cohort", NAME, primary_key=True),
    sa.Column("resource", RESOURCE, primary_key=True),
    sa.Column("cap", sa.BigInteger, nullable=False),
    sa.Column("used", sa.BigInteger, nullable=False, server_default="0"),
)

tenant_quota = sa.Table(
    "qg_tenant_quota",
    metadata,
    sa.Column("tenant", NAME, primary_key=True),
    sa.Column("resource", RESOURCE, primary_key=True),
    sa.Column("cap", sa.BigInteger, nullable=False),
    sa.Column("used", sa.BigInteger, nullable=False, server_default="0"),
    # For a cohort member: how far above ``cap`` (its nominal) it may borrow
    # (NULL: as far as the cohort has room), and how much of its nominal it lends
    # (NULL: all of it). Ignored for a tenant without a cohort.
    sa.Column("borrowing_limit", sa.BigInteger, nullable=True),
    sa.Column("lending_limit", sa.BigInteger, nullable=True),
    # The root cohort whose room this row shares (NULL: the tenant is in none), kept
    # with every change of the tenant's cohort or of the tree. Admission and release
    # read it from the very row they charge, so a concurrent move in the tree (which
    # rewrites these rows) cannot slip between reading the root and charging its room.
    sa.Column("cohort_root", NAME, nullable=True),
    # With a fair-share half-life (docs/decisions/712): the tenant's past use of the
    # resource, resource-seconds decayed to ``decayed_at``; raised at every release.
    sa.Column("decayed", sa.Double, nullable=False, server_default="0"),
    sa.Column("decayed_at", TIME, nullable=True),
)

# A tenant's budget per resource (docs/decisions/710): ``amount`` resource-seconds
# per rolling ``window_length`` seconds; ``reserved`` = sum of cost * reserved runtime of its
# running work; ``accrued`` = all usage its released work ever accrued (raised
# with the buckets, so admission can count releases committed after its read).
tenant_budget = sa.Table(
    "qg_tenant_budget",
    metadata,
    sa.Column("tenant", NAME, primary_key=True),
    sa.Column("resource", RESOURCE, primary_key=True),
    sa.Column("amount", sa.BigInteger, nullable=False),
    sa.Column("window_length", sa.BigInteger, nullable=False),
    sa.Column("reserved", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("accrued", sa.BigInteger, nullable=False, server_default="0"),
)

# Released work's usage, whole resource-seconds (rounded up) per hour bucket
# (``bucket``: its start). Integers, so admission's check and the database's agree exactly.
budget_usage = sa.Table(
    "qg_budget_usage",
    metadata,
    sa.Column("tenant", NAME, primary_key=True),
    sa.Column("resource", RESOURCE, primary_key=True),
    sa.Column("bucket", sa.BigInteger, primary_key=True),
    sa.Column("amount", sa.BigInteger, nullable=False),
)

pool = sa.Table(
    "qg_pool",
    metadata,
    sa.Column("name", NAME, primary_key=True),
    sa.Column("created", TIME, nullable=False),
)

pool_capacity = sa.Table(
    "qg_pool_capacity",
    metadata,
    sa.Column("pool", NAME, primary_key=True),
    # Capacity slices (docs/decisions/029-capacity-slices.md): each pool's cap per
    # resource is split over its slices, 0 … S-1; the pool's cap and use are the
    # sums. Most pools have one slice, 0. The key order (pool, slice, resource) is
    # the order rows are locked in.
    sa.Column("slice", sa.Integer, primary_key=True, server_default="0"),
    sa.Column("resource", RESOURCE, primary_key=True),
    sa.Column("cap", sa.BigInteger, nullable=False),
    sa.Column("used", sa.BigInteger, nullable=False, server_default="0"),
)

request = sa.Table(
    "qg_request",
    metadata,
    sa.Column("id", REQUEST_ID, primary_key=True),
    sa.Column("tenant", NAME, nullable=False),
    sa.Column("state", sa.String(16), nullable=False),
    # Canonical JSON ({"gpu": 1}, sorted keys): compared byte for byte on resubmit.
    sa.Column("cost", sa.String(2048), nullable=False),
    sa.Column("priority", sa.Integer, nullable=False),
    sa.Column("payload", sa.Text, nullable=False),
    sa.Column("target", NAME, nullable=True),
    sa.Column("pool", NAME, nullable=True),
    # The pool slice the cost was charged to and goes back to (NULL: slice 0).
    sa.Column("pool_slice", sa.Integer, nullable=True),
    # created / aging_interval - priority: see quotagate.domain.ordering.
    sa.Column("queue_key", sa.Double, nullable=False),
    sa.Column("created", TIME, nullable=False),
    sa.Column("updated", TIME, nullable=False),
    sa.Column("reason", sa.String(1024), nullable=True),
    # Budgets (docs/fair-sharing.md#budgets): the max-runtime as submitted (part of
    # the request's identity), the one its budget reserves (submitted, else the
    # tenant's default at submission), and when it was admitted — accrual runs
    # from there to its release, so a crash between loses nothing.
    sa.Column("max_runtime", sa.BigInteger, nullable=True),
    sa.Column("reserved_runtime", sa.BigInteger, nullable=True),
    sa.Column("admitted", TIME, nullable=True),
    # The delivery generation: 1, raised by one at every requeue after a preemption.
    # It goes into the external name, so a new attempt never meets the stopped
    # one's object (docs/decisions/720).
    sa.Column("attempt", sa.Integer, nullable=False, server_default="1"),
    # The last fencing token an earlier attempt carried: the next attempt's outbox
    # row counts on from it, so tokens keep growing across attempts.
    sa.Column("token_floor", sa.BigInteger, nullable=False, server_default="0"),
    # The request whose preemption stopped this one (kept after a requeue: a
    # requeued victim never preempts its own preemptor, docs/decisions/722).
    sa.Column("preempted_by", REQUEST_ID, nullable=True),
    # Admission reads the head of each tenant's queue from this index.
    sa.Index(None, "tenant", "state", "queue_key", "created", "id"),
    # Expiry and "oldest waiting" read from this one.
    sa.Index(None, "state", "created"),
    # A tenant's requests, newest first (HTTP listing).
    sa.Index(None, "tenant", "created", "id"),
    sa.Index(None, "created"),
    # Preemption's victims (metrics count requeues from them; most rows are NULL).
    sa.Index(None, "preempted_by"),
)

outbox = sa.Table(
    "qg_outbox",
    metadata,
    sa.Column("request_id", REQUEST_ID, primary_key=True),
    sa.Column("tenant", NAME, nullable=False),
    sa.Column("target", NAME, nullable=True),
    sa.Column("created", TIME, nullable=False),
    sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
    sa.Column("next_attempt_at", TIME, nullable=False),
    sa.Column("claimed_by", sa.String(128), nullable=True),
    sa.Column("claim_generation", sa.BigInteger, nullable=True),
    sa.Column("claimed_until", TIME, nullable=True),
    # Raised by one at every claim: the fencing token sent downstream, so a later
    # delivery attempt of the same request always carries a larger token.
    sa.Column("claim_token", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("delivered", sa.Boolean, nullable=False, server_default=sa.false()),
    sa.Column("delivered_at", TIME, nullable=True),
    sa.Column("last_error", sa.String(2048), nullable=True),
    # A stop's last answer while the target carries it out ("SIGTERM sent, waiting for
    # the exit"): kept apart from ``last_error``, which only a failed attempt sets, so a
    # healthy stop in progress never reads as failing (docs/decisions/823).
    sa.Column("stop_progress", sa.String(2048), nullable=True),
    # Set when the request is cancelled while reserved or delivered: the row is
    # then a stop to carry out, claimed and fenced like a delivery.
    sa.Column("stopping", sa.Boolean, nullable=False, server_default=sa.false()),
    # The claimable read's whole filter and order (docs/decisions/257): the next batch is
    # the first rows of this index, with no sort of the backlog. The stops' index leads
    # with both flags too: as ``(stopping, next_attempt_at)`` MariaDB chose it for the
    # deliveries and walked every delivered row still running before the first due one.
    sa.Index(None, "delivered", "stopping", "next_attempt_at", "request_id"),
    sa.Index(None, "stopping", "delivered", "next_attempt_at", "request_id"),
)

# The room a preemption frees, held for its preemptor (docs/decisions/721): while
# the preemptor waits and the hold has not expired, admission places nothing
# that would keep it from fitting once its victims' cost is back.
hold = sa.Table(
    "qg_hold",
    metadata,
    sa.Column("request_id", REQUEST_ID, primary_key=True),
    sa.Column("tenant", NAME, nullable=False),
    sa.Column("created", TIME, nullable=False),
    sa.Column("expires", TIME, nullable=False),
)

binding = sa.Table(
    "qg_binding",
    metadata,
    sa.Column("request_id", REQUEST_ID, primary_key=True),
    sa.Column("target", NAME, nullable=False),
    sa.Column("external_name", sa.String(253), nullable=False),
    sa.Column("uid", sa.String(256), nullable=True),
    sa.Column("fencing_token", sa.BigInteger, nullable=False),
    sa.Column("created", TIME, nullable=False),
)

lease = sa.Table(
    "qg_lease",
    metadata,
    sa.Column("name", sa.String(128), primary_key=True),
    sa.Column("owner", sa.String(128), nullable=True),
    sa.Column("generation", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("expires_at", TIME, nullable=False),
)

delivery_target = sa.Table(
    "qg_target",
    metadata,
    sa.Column("name", NAME, primary_key=True),
    sa.Column("kind", sa.String(32), nullable=False),
    sa.Column("config", sa.Text, nullable=False),
    sa.Column("is_default", sa.Boolean, nullable=False, server_default=sa.false()),
)

# The tenants a target serves. A target with no rows here serves every tenant;
# one with rows serves only those (docs/decisions/311-target-tenants.md).
target_tenant = sa.Table(
    "qg_target_tenant",
    metadata,
    sa.Column("target", NAME, primary_key=True),
    sa.Column("tenant", NAME, primary_key=True),
)

audit = sa.Table(
    "qg_audit",
    metadata,
    sa.Column("id", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True,
              autoincrement=True),
    sa.Column("at", TIME, nullable=False),
    sa.Column("actor", sa.String(128), nullable=False),
    sa.Column("tenant", NAME, nullable=True),
    sa.Column("operation", sa.String(64), nullable=False),
    sa.Column("target", sa.String(253), nullable=True),
    sa.Column("outcome", sa.String(32), nullable=False),
    sa.Column("reason", sa.String(1024), nullable=True),
    sa.Index(None, "tenant", "id"),
    # The dashboard's last hour of decisions, and one request's story.
    sa.Index(None, "at"),
    sa.Index(None, "target"),
)

api_token = sa.Table(
    "qg_api_token",
    metadata,
    sa.Column("id", sa.String(32), primary_key=True),
    # sha256 of the secret; the secret itself is shown once and never stored.
    sa.Column("secret_hash", sa.String(64), nullable=False),
    sa.Column("tenant", NAME, nullable=True),
    sa.Column("admin", sa.Boolean, nullable=False),
    # Set for executor tokens: the target whose delivered work they may end
    # (docs/decisions/310-executor-tokens-and-callbacks.md).
    sa.Column("executor_target", NAME, nullable=True),
    sa.Column("label", sa.String(128), nullable=True),
    sa.Column("created", TIME, nullable=False),
    sa.Column("revoked", TIME, nullable=True),
)

rate_bucket = sa.Table(
    "qg_rate_bucket",
    metadata,
    sa.Column("key", sa.String(200), primary_key=True),
    sa.Column("tenant", NAME, nullable=False),
    sa.Column("capacity", sa.Double, nullable=False),
    sa.Column("refill_per_second", sa.Double, nullable=False),
    sa.Column("tokens", sa.Double, nullable=False),
    sa.Column("updated", TIME, nullable=False),
)

# Facts about the ledger itself, one row each; today only ``ledger_id``, the
# identity that init gives every ledger and that goes into every external object.
ledger_meta = sa.Table(
    "qg_meta",
    metadata,
    sa.Column("key", sa.String(64), primary_key=True),
    sa.Column("value", sa.String(256), nullable=False),
)

# Streams (docs/streams.md): a tenant's topics, charged to its quota in the
# resources "partitions" and "parallelism"; Redis holds the streams themselves.
topic = sa.Table(
    "qg_topic",
    metadata,
    sa.Column("tenant", NAME, primary_key=True),
    sa.Column("name", sa.String(100), primary_key=True),
    sa.Column("partitions", sa.Integer, nullable=False),
    sa.Column("parallelism", sa.Integer, nullable=False),
    sa.Column("max_len", sa.BigInteger, nullable=True),
    sa.Column("created", TIME, nullable=False),
)

# A tenant's stream settings: length cap, in-flight cap, and its own Redis (or NULL: the shared one).
tenant_stream = sa.Table(
    "qg_tenant_stream",
    metadata,
    sa.Column("tenant", NAME, primary_key=True),
    sa.Column("max_len", sa.BigInteger, nullable=True),
    sa.Column("max_in_flight", sa.BigInteger, nullable=True),
    sa.Column("redis_url", sa.String(512), nullable=True),
)

# MariaDB and MySQL compare text by the database's default collation, usually a
# case-insensitive one: "JOB-1" would find "job-1" and another tenant's "Job-1"
# would be "taken". Binary collation gives the byte-for-byte comparison SQLite
# and PostgreSQL give, for ids, names and every other text column alike
# (docs/decisions/801-binary-collation-on-mariadb.md; migration 0009).
BINARY_TEXT = {"mysql_charset": "utf8mb4", "mysql_collate": "utf8mb4_bin"}
for _table in metadata.tables.values():
    _table.dialect_kwargs.update(BINARY_TEXT)
