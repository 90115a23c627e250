"""``quotagate diagnose ID``: one request, asked layer by layer, in the order that settles most.

1. quota — was it refused at the gate? A rejected request never ran: stop here.
2. lease — which worker generation delivered it, with which fencing token, and
   has a newer generation of that worker taken over since?
3. checkpoint — for a streaming request: the newest batch the engine committed
   against the newest batch marker the sink committed. Commit log ahead: a
   batch the engine counts as done left no business effect (the sink failed
   part-way or wrote elsewhere). Markers ahead: the sink's batch took effect but
   the engine did not record it; it will be replayed, and must converge.
4. idempotency — per batch, how often it was written and how many rows were
   already there: replays going up *with* conflicts going up means it worked.

See docs/streaming.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quotagate.app import Quotagate
from quotagate.delivery.dispatcher import lease_name
from quotagate.delivery.targets.spark_launcher import checkpoint_location
from quotagate.domain.model import RequestState
from quotagate.errors import NotFound, QuotagateError
from quotagate.store.engine import normalise_url
from quotagate.streaming.checkpoint import CheckpointState, read_checkpoint
from quotagate.streaming.sink_store import BatchMarker, SinkStore


@dataclass
class Layer:
    """What one layer says: a verdict sentence and the facts it rests on."""

    name: str
    verdict: str
    facts: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"layer": self.name, "verdict": self.verdict, **self.facts}


@dataclass(frozen=True)
class StreamingLocation:
    """Where a streaming request's engine and sink keep their records."""

    checkpoint: str | None = None
    sink_url: str | None = None
    query: str | None = None


def diagnose(gate: Quotagate, request_id: str, where: StreamingLocation | None = None) -> list[Layer]:
    """The layers in troubleshooting order; a rejected request yields the quota layer only."""
    request = gate.show(request_id)
    layers = [_quota(gate, request.id, request.tenant, request.state, request.reason)]
    if request.state in (RequestState.REJECTED, RequestState.EXPIRED):
        return layers
    trail = gate.delivery_trail(request_id)
    layers.append(_lease(gate, request.state, trail.outbox, trail.binding))
    location = _spark_defaults(gate, request.tenant, trail.binding, where or StreamingLocation())
    if location.checkpoint is None and location.sink_url is None:
        layers.append(Layer("checkpoint", "not delivered by a spark target, and no checkpoint/sink given "
                                          "(--checkpoint, --sink-db); nothing to compare"))
        return layers
    markers: list[BatchMarker] | None = None
    rows_in_table: dict[str, int] = {}
    fence_token: int | None = None
    if location.sink_url is not None:
        _refuse_a_missing_sqlite_file(location.sink_url)
        with SinkStore(location.sink_url) as sink:
            markers = sink.markers(location.query)
            for table in sorted({marker.business_table for marker in markers}):
                rows_in_table[table] = sink.count_rows(table)
            fence_token = sink.fencing_token(request_id)
    state = read_checkpoint(location.checkpoint) if location.checkpoint is not None else None
    layers.append(_checkpoint(state, markers, rows_in_table))
    layers.append(_idempotency(markers, fence_token, trail.binding))
    return layers


def _refuse_a_missing_sqlite_file(url: str) -> None:
    """Opening a SQLite URL creates the file: a mistyped --sink-db would look like an empty sink."""
    parsed = normalise_url(url)
    if parsed.get_backend_name() == "sqlite" and not Path(str(parsed.database)).is_file():
        raise NotFound(f"no sink database at {parsed.database}: check --sink-db; nothing was created",
                       code="sink_database_missing")


def _spark_defaults(gate: Quotagate, tenant: str, binding: dict[str, Any] | None,
                    given: StreamingLocation) -> StreamingLocation:
    """A request delivered by a spark target has a known checkpoint and query name."""
    if binding is None:
        return given
    try:
        target = gate.target(binding["target"])
    except NotFound:
        return given
    if target.kind != "spark":
        return given
    checkpoint = given.checkpoint or str(checkpoint_location(
        target.config["checkpoint_root"], gate.ledger_id, tenant, binding["external_name"]))
    return StreamingLocation(checkpoint, given.sink_url, given.query or binding["external_name"])


def _quota(gate: Quotagate, request_id: str, tenant: str, state: RequestState,
           reason: str | None) -> Layer:
    try:
        bucket = gate.rate_status(tenant)
    except QuotagateError:
        bucket = None
    facts: dict[str, Any] = {"state": state.value, "tenant": tenant, "reason": reason,
                             "rate_tokens": None if bucket is None else bucket["tokens"]}
    if state == RequestState.REJECTED:
        return Layer("quota", f"rejected at the gate ({reason or 'no reason recorded'}): it never entered "
                              "the queue nor ran; there is no lease, checkpoint or sink to look at", facts)
    if state == RequestState.EXPIRED:
        return Layer("quota", "expired while waiting: it was never admitted nor ran", facts)
    if state == RequestState.WAITING:
        # explain's own sentence: a quota lowered under the cost says so (docs/decisions/809).
        why = gate.explain(request_id)["reason"]
        return Layer("quota", f"accepted, still waiting: {why}", facts)
    # An ended request's reason is why it ended (a failed job's exception, a stop's cause).
    return Layer("quota", f"accepted and admitted; now {state.value}"
                          + (f" ({reason})" if reason else ""), facts)


def _lease(gate: Quotagate, state: RequestState, outbox: dict[str, Any] | None,
           binding: dict[str, Any] | None) -> Layer:
    if outbox is None:
        # The outbox row also goes when admitted work ends before its delivery (with the
        # release) or when its stop is confirmed: only a waiting request was never admitted.
        if state == RequestState.WAITING:
            return Layer("lease", "no delivery record: the request was never admitted", {})
        if binding is not None:
            return Layer("lease", f"delivered as {binding['external_name']} with fencing token "
                                  f"{binding['fencing_token']}; its delivery record went when it "
                                  f"ended ({state.value})", {"fencing_token": binding["fencing_token"],
                                                             "external_name": binding["external_name"]})
        return Layer("lease", f"admitted, then {state.value} before any worker delivered it: "
                              "no delivery record is left", {})
    facts: dict[str, Any] = {
        "worker": outbox["claimed_by"], "claim_generation": outbox["claim_generation"],
        "fencing_token": binding["fencing_token"] if binding else outbox["claim_token"],
        "attempts": outbox["attempts"], "delivered": bool(outbox["delivered"]),
        "external_name": binding["external_name"] if binding else None,
        "last_error": outbox["last_error"],
        # A stop under way: the target's answer, no failure (docs/decisions/823).
        "stop_progress": outbox["stop_progress"],
    }
    if outbox["claimed_by"] is None:
        return Layer("lease", "admitted, not claimed by any worker yet", facts)
    try:
        lease = gate.lease(lease_name(outbox["claimed_by"]))
    except NotFound:
        lease = None
    facts["lease_generation_now"] = None if lease is None else lease.generation
    facts["lease_owner_now"] = None if lease is None else lease.owner
    who = f"worker {outbox['claimed_by']!r} generation {outbox['claim_generation']}"
    verb = "delivered by" if outbox["delivered"] else "claimed by"
    token = f"fencing token {facts['fencing_token']}"
    if lease is not None and outbox["claim_generation"] is not None and lease.generation > outbox["claim_generation"]:
        return Layer("lease", f"{verb} {who} with {token}; taken over since: the lease is at generation "
                              f"{lease.generation}, so writes of generation {outbox['claim_generation']} "
                              "are refused", facts)
    return Layer("lease", f"{verb} {who} with {token}; no takeover since", facts)


def _checkpoint(state: CheckpointState | None, markers: list[BatchMarker] | None,
                rows_in_table: dict[str, int]) -> Layer:
    latest_marker = max((marker.batch_id for marker in markers), default=None) if markers is not None else None
    facts: dict[str, Any] = {
        "checkpoint": None if state is None else state.to_dict(),
        "latest_marker": latest_marker,
        "rows_in_table": rows_in_table,
        "rows_inserted_by_batches": None if markers is None else sum(marker.inserted for marker in markers),
    }
    if state is None or markers is None:
        missing = "--checkpoint" if state is None else "--sink-db"
        return Layer("checkpoint", f"only one side is known; give {missing} to compare them", facts)
    if not state.exists:
        return Layer("checkpoint", f"no checkpoint at {state.location}: the query never started there", facts)
    committed = state.latest_commit
    bypassed = sum(rows_in_table.values()) - sum(marker.inserted for marker in markers)
    notes = []
    if bypassed > 0:
        notes.append(f"; {bypassed} row(s) in the business table(s) came from no batch: written around "
                     "the checkpoint (by hand, or by another writer of the same table)")
    # Either side may have no batch at all (a first batch whose commits/0 was never
    # written, or is deleted): said in words, where it read "ends at None".
    if committed == latest_marker:
        verdict = ("in step: neither the commit log nor the sink has a batch yet" if committed is None
                   else f"in step: the commit log and the sink both end at batch {committed}")
    elif latest_marker is None or (committed is not None and committed > latest_marker):
        newest = " has no batch" if latest_marker is None else f"'s newest batch is {latest_marker}"
        verdict = (f"commit log ahead: the engine committed batch {committed} but the sink{newest}; "
                   "a batch counted as done left no business effect (the sink failed part-way, "
                   "or wrote somewhere else)")
    else:
        log_end = "has no entry" if committed is None else f"ends at {committed}"
        verdict = (f"sink ahead: batch {latest_marker} took effect but the commit log {log_end}; "
                   "the engine will run it again on restart, and the sink must absorb it as conflicts")
    return Layer("checkpoint", verdict + "".join(notes), facts)


def _idempotency(markers: list[BatchMarker] | None, fence_token: int | None,
                 binding: dict[str, Any] | None) -> Layer:
    if markers is None:
        return Layer("idempotency", "no sink database given (--sink-db): conflict counts unknown", {})
    batches = [{"batch_id": marker.batch_id, "deliveries": marker.deliveries, "rows": marker.rows_seen,
                "inserted": marker.inserted, "conflicts": marker.conflicts} for marker in markers]
    facts: dict[str, Any] = {"batches": batches, "sink_fence_token": fence_token}
    replayed = [marker for marker in markers if marker.deliveries > 1]
    suspicious = [marker for marker in replayed if marker.conflicts == 0 and marker.rows_seen > 0]
    parts = []
    if not markers:
        parts.append("no batch has taken effect yet")
    elif not replayed:
        parts.append(f"{len(markers)} batch(es), none written twice")
    else:
        parts.append(f"{len(replayed)} batch(es) written more than once, "
                     f"{sum(marker.conflicts for marker in replayed)} conflict(s) absorbed: replays converged")
    if suspicious:
        parts.append(f"batch(es) {', '.join(str(marker.batch_id) for marker in suspicious)} replayed without "
                     "conflicts: the replay carried different rows")
    if fence_token is not None and binding is not None and fence_token > int(binding["fencing_token"]):
        parts.append(f"the sink saw fencing token {fence_token}, newer than the bound delivery's "
                     f"{binding['fencing_token']}")
    return Layer("idempotency", "; ".join(parts), facts)

