"""The checkpoint and idempotency layers of diagnose: the engine's commit log against the sink's markers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from quotagate import NotFound, Quotagate
from quotagate.streaming import SinkStore
from quotagate.streaming.diagnose import StreamingLocation, diagnose
from support.sink_workers import EVENT_KEYS, event_columns, events


def layers(gate: Quotagate, where: StreamingLocation) -> dict[str, dict[str, Any]]:
    return {layer.name: layer.to_dict() for layer in diagnose(gate, "stream-1", where)}


def write_batch_files(checkpoint: Path, log: str, *batches: int) -> None:
    (checkpoint / log).mkdir(parents=True, exist_ok=True)
    for batch in batches:
        (checkpoint / log / str(batch)).write_text("v1\n")


def test_the_checkpoint_layer_compares_the_commit_log_with_the_sink(gate: Quotagate, tmp_path: Path) -> None:
    gate.set_tenant("team-a", {"gpu": 4})
    gate.set_pool("pool-1", {"gpu": 4})
    gate.submit("stream-1", "team-a", {"gpu": 1})
    gate.admit_until_idle()
    sink_url = f"sqlite:///{tmp_path / 'business.db'}"
    with SinkStore(sink_url) as sink:
        table = sink.business_table("events", EVENT_KEYS, event_columns)
        sink.write_batch("q", 0, table, EVENT_KEYS, lambda: events(0, 3))
        sink.write_batch("q", 1, table, EVENT_KEYS, lambda: events(3, 2))
        sink.write_batch("q", 1, table, EVENT_KEYS, lambda: events(3, 2))
    checkpoint = tmp_path / "checkpoint"
    write_batch_files(checkpoint, "offsets", 0, 1)
    write_batch_files(checkpoint, "commits", 0)
    where = StreamingLocation(str(checkpoint), sink_url, "q")

    ahead = layers(gate, where)
    assert list(ahead) == ["quota", "lease", "checkpoint", "idempotency"]
    assert ahead["lease"]["verdict"] == "admitted, not claimed by any worker yet"
    assert ahead["checkpoint"]["verdict"].startswith("sink ahead: batch 1 took effect but the commit log ends at 0")
    assert ahead["checkpoint"]["checkpoint"]["planned_not_committed"] == [1]
    assert ahead["idempotency"]["batches"][1] == {"batch_id": 1, "deliveries": 2, "rows": 2, "inserted": 2,
                                                  "conflicts": 2}
    assert "replays converged" in ahead["idempotency"]["verdict"]

    write_batch_files(checkpoint, "commits", 1)
    assert layers(gate, where)["checkpoint"]["verdict"].startswith("in step")

    write_batch_files(checkpoint, "offsets", 2)
    write_batch_files(checkpoint, "commits", 2)
    with SinkStore(sink_url) as sink, sink.engine.begin() as connection:
        connection.exec_driver_sql("INSERT INTO events (event_id, amount) VALUES ('by-hand', 0)")
    behind = layers(gate, where)["checkpoint"]
    assert behind["verdict"].startswith("commit log ahead: the engine committed batch 2")
    assert "1 row(s) in the business table(s) came from no batch" in behind["verdict"]


def test_a_side_without_any_batch_is_said_in_words(gate: Quotagate, tmp_path: Path) -> None:
    # The first batch took effect, its commits/0 is missing: it read "the commit log ends at None".
    gate.set_tenant("team-a", {"gpu": 4})
    gate.set_pool("pool-1", {"gpu": 4})
    gate.submit("stream-1", "team-a", {"gpu": 1})
    sink_url = f"sqlite:///{tmp_path / 'business.db'}"
    with SinkStore(sink_url) as sink:
        sink.business_table("events", EVENT_KEYS, event_columns)
    checkpoint = tmp_path / "checkpoint"
    write_batch_files(checkpoint, "offsets", 0)
    where = StreamingLocation(str(checkpoint), sink_url, "q")
    assert layers(gate, where)["checkpoint"]["verdict"] == (
        "in step: neither the commit log nor the sink has a batch yet")

    write_batch_files(checkpoint, "commits", 0)
    assert layers(gate, where)["checkpoint"]["verdict"].startswith(
        "commit log ahead: the engine committed batch 0 but the sink has no batch; ")

    (checkpoint / "commits" / "0").unlink()
    with SinkStore(sink_url) as sink:
        table = sink.business_table("events", EVENT_KEYS, event_columns)
        sink.write_batch("q", 0, table, EVENT_KEYS, lambda: events(0, 3))
    verdict = layers(gate, where)["checkpoint"]["verdict"]
    assert verdict.startswith("sink ahead: batch 0 took effect but the commit log has no entry; ")
    assert "None" not in verdict


def test_without_a_sink_or_checkpoint_the_streaming_layers_say_what_is_missing(gate: Quotagate) -> None:
    gate.set_tenant("team-a", {"gpu": 4})
    gate.set_pool("pool-1", {"gpu": 4})
    gate.submit("stream-1", "team-a", {"gpu": 1})
    shown = layers(gate, StreamingLocation())
    assert shown["quota"]["verdict"].startswith("accepted, still waiting")
    assert shown["lease"]["verdict"] == "no delivery record: the request was never admitted"
    assert "--checkpoint" in shown["checkpoint"]["verdict"]


def test_work_ended_before_its_delivery_is_not_called_never_admitted(gate: Quotagate) -> None:
    gate.set_tenant("team-a", {"gpu": 4})
    gate.set_pool("pool-1", {"gpu": 4})
    gate.submit("stream-1", "team-a", {"gpu": 1})
    assert len(gate.admit(limit=1)) == 1
    gate.complete("stream-1")
    shown = layers(gate, StreamingLocation())
    assert shown["quota"]["verdict"] == "accepted and admitted; now completed"
    assert shown["lease"]["verdict"] == ("admitted, then completed before any worker delivered it: "
                                         "no delivery record is left")


def test_a_sink_database_that_is_not_there_is_reported_and_not_created(gate: Quotagate, tmp_path: Path) -> None:
    gate.set_tenant("team-a", {"gpu": 4})
    gate.set_pool("pool-1", {"gpu": 4})
    gate.submit("stream-1", "team-a", {"gpu": 1})
    missing = tmp_path / "mistyped.db"
    with pytest.raises(NotFound) as refused:
        diagnose(gate, "stream-1", StreamingLocation(sink_url=f"sqlite:///{missing}"))
    assert refused.value.code == "sink_database_missing"
    assert str(missing) in refused.value.message
    assert not missing.exists()
