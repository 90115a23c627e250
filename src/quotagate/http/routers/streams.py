"""Topics and messages over HTTP (docs/streams.md).

``PUT|GET|DELETE /v1/tenants/{tenant}/topics/{topic}``, ``GET …/topics``,
``POST …/topics/{topic}/messages`` (one message or a batch) and
``GET …/topics/{topic}/status``. A token of another tenant is answered 404,
as for requests: it must not learn which topics exist. A producer refused by
the topic's rate quota gets 429 with ``Retry-After``.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field, StrictStr

from quotagate.auth import authorizer as operations
from quotagate.domain.model import validate_name
from quotagate.http.context import Context
from quotagate.http.models import RateBody, WholeNumber
from quotagate.http.routers.rate import rate_view
from quotagate.http.security import CurrentActor, authorize
from quotagate.streams.producer import MAX_BATCH
from quotagate.streams.topics import MAX_LEN, MAX_PARTITIONS, TopicSpec

router = APIRouter(prefix="/v1/tenants/{tenant}/topics", tags=["streams"])


class TopicBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    partitions: WholeNumber = Field(description="Partitions, charged to the quota 'partitions'",
                                    examples=[4],
                                    json_schema_extra={"minimum": 1, "maximum": MAX_PARTITIONS})
    parallelism: WholeNumber = Field(description="Most consumers of one group at a time, charged "
                                     "to the quota 'parallelism'", examples=[2],
                                     json_schema_extra={"minimum": 1, "maximum": MAX_PARTITIONS})
    max_len: WholeNumber | None = Field(default=None, description="Approximate length cap per "
                                        "partition (at most the tenant's stream length limit)",
                                        json_schema_extra={"minimum": 1, "maximum": MAX_LEN})
    rate: RateBody | None = Field(default=None, description="Producer rate quota")


class MessageBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    data: StrictStr = Field(max_length=1024 * 1024, examples=["hello"])
    key: StrictStr | None = Field(default=None, max_length=256, description="Partition key")


class MessagesBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    messages: list[MessageBody] = Field(max_length=MAX_BATCH)


def _view(spec: TopicSpec) -> dict[str, Any]:
    return {"tenant": spec.tenant, "topic": spec.name, "partitions": spec.partitions,
            "parallelism": spec.parallelism, "max_len": spec.max_len}


@router.get("", summary="A tenant's topics")
def list_topics(tenant: str, context: Context, actor: CurrentActor) -> dict[str, Any]:
    authorize(context, actor, tenant, operations.TOPIC_READ)
    validate_name(tenant, "tenant")
    return {"topics": [_view(spec) for spec in context.gate.streams.list_topics(tenant)]}


@router.put("/{topic}", summary="Create a topic, charged to the tenant's quota")
def put_topic(
    tenant: str, topic: str, body: TopicBody, context: Context, actor: CurrentActor
) -> dict[str, Any]:
    authorize(context, actor, tenant, operations.TOPIC_CREATE, request_id=topic)
    spec = context.gate.streams.create_topic(
        tenant, topic, partitions=body.partitions, parallelism=body.parallelism,
        max_len=body.max_len, rate=None if body.rate is None else body.rate.config(),
        actor=actor.name)
    return _view(spec)


@router.get("/{topic}", summary="A topic's spec and producer rate quota")
def get_topic(tenant: str, topic: str, context: Context, actor: CurrentActor) -> dict[str, Any]:
    authorize(context, actor, tenant, operations.TOPIC_READ, request_id=topic)
    spec = context.gate.streams.topic(tenant, topic)
    return {**_view(spec), "rate": rate_view(context.gate.rate_status(tenant, topic=topic))}


@router.delete("/{topic}", summary="Delete a topic; its quota comes back once")
def delete_topic(tenant: str, topic: str, context: Context, actor: CurrentActor) -> dict[str, Any]:
    authorize(context, actor, tenant, operations.TOPIC_DELETE, request_id=topic)
    spec = context.gate.streams.delete_topic(tenant, topic, actor=actor.name)
    return {**_view(spec), "deleted": True}


@router.post("/{topic}/messages", summary="Produce one message or a batch (429 over rate)")
def post_messages(
    tenant: str, topic: str, body: MessageBody | MessagesBody, context: Context,
    actor: CurrentActor,
) -> dict[str, Any]:
    authorize(context, actor, tenant, operations.STREAM_PRODUCE, request_id=topic)
    messages = body.messages if isinstance(body, MessagesBody) else [body]
    producer = context.gate.streams.shared_producer(tenant, topic)
    ids = producer.send_many([(message.data, message.key) for message in messages])
    return {"ids": ids}


@router.get("/{topic}/status", summary="Per partition: length, pending, lag, frontier, owner")
def get_status(tenant: str, topic: str, context: Context, actor: CurrentActor) -> dict[str, Any]:
    authorize(context, actor, tenant, operations.STREAM_READ, request_id=topic)
    return context.gate.streams.status(tenant, topic).to_dict()
