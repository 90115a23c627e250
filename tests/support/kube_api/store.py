"""The API server's storage: served resource types, objects, and the event history.

Every write bumps one global ``resourceVersion`` (as etcd's revision does) and
appends an event, so a watch from a version replays exactly what changed
after it; ``compact`` forgets the history, after which a watch from an older
version gets 410 Expired, as on a real server.
"""

from __future__ import annotations

import copy
import threading
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from support.kube_api import status
from support.kube_api.validation import (
    Cause,
    Requirement,
    matches,
    merge_patch,
    metadata_causes,
    prune_and_validate,
)

REPOSITORY = Path(__file__).resolve().parents[3]
MODEL_SERVICE_CRD = REPOSITORY / "deploy" / "crds" / "modelservice.yaml"


@dataclass(frozen=True)
class ResourceType:
    """One served version of a custom resource, as its CRD defines it."""

    group: str
    version: str
    plural: str
    kind: str
    list_kind: str
    schema: Mapping[str, Any]
    status_subresource: bool

    @property
    def resource(self) -> str:
        return f"{self.plural}.{self.group}"

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"


def load_crd(path: Path = MODEL_SERVICE_CRD) -> list[ResourceType]:
    """The served versions of a CustomResourceDefinition file (e.g. deploy/crds/…)."""
    [crd] = [document for document in yaml.safe_load_all(path.read_text())
             if document and document.get("kind") == "CustomResourceDefinition"]
    spec = crd["spec"]
    if spec.get("scope") != "Namespaced":
        raise ValueError("only namespaced custom resources are served here")
    names = spec["names"]
    return [
        ResourceType(spec["group"], version["name"], names["plural"], names["kind"],
                     names.get("listKind", names["kind"] + "List"),
                     version["schema"]["openAPIV3Schema"],
                     "status" in (version.get("subresources") or {}))
        for version in spec["versions"] if version.get("served")
    ]


@dataclass(frozen=True)
class Event:
    revision: int
    resource: str
    namespace: str
    old: dict[str, Any] | None
    new: dict[str, Any] | None  # None: deleted (``old`` is the last state)

    def as_seen_by(self, requirements: list[Requirement]) -> tuple[str, dict[str, Any]] | None:
        """The watch event type a watcher with this selector sees, if any (object leaving → DELETED)."""
        was = self.old is not None and matches(requirements, self.old["metadata"].get("labels"))
        now = self.new is not None and matches(requirements, self.new["metadata"].get("labels"))
        if now and self.new is not None:
            return ("MODIFIED" if was else "ADDED"), self.new
        if was and self.old is not None:
            gone = copy.deepcopy(self.old)
            gone["metadata"]["resourceVersion"] = str(self.revision)
            return "DELETED", gone
        return None


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class ObjectStore:
    types: dict[tuple[str, str, str], ResourceType] = field(default_factory=dict)
    namespaces: set[str] = field(default_factory=lambda: {"default"})
    objects: dict[tuple[str, str, str], dict[str, Any]] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)
    revision: int = 1
    oldest_watchable: int = 1  # watches from below this get 410 Expired
    changed: threading.Condition = field(default_factory=threading.Condition)
    created: list[str] = field(default_factory=list)  # names, once per successful create

    def serve(self, resource_types: list[ResourceType]) -> None:
        for resource_type in resource_types:
            self.types[(resource_type.group, resource_type.version, resource_type.plural)] = \
                resource_type

    def resource_type(self, group: str, version: str, plural: str) -> ResourceType:
        found = self.types.get((group, version, plural))
        if found is None:
            if not any(served_group == group for served_group, _, _ in self.types):
                raise status.page_not_found()
            raise status.not_found_resource()
        return found

    def check_namespace(self, namespace: str) -> None:
        if namespace not in self.namespaces:
            raise status.ApiError(404, "NotFound", f'namespaces "{namespace}" not found',
                                  {"name": namespace, "kind": "namespaces"})

    # -- reads -------------------------------------------------------------------

    def get(self, kind: ResourceType, namespace: str, name: str) -> dict[str, Any]:
        with self.changed:
            found = self.objects.get((kind.resource, namespace, name))
            if found is None:
                raise status.not_found(kind.resource, kind.group, kind.plural, name)
            return copy.deepcopy(found)

    def list(self, kind: ResourceType, namespace: str,
             requirements: list[Requirement]) -> tuple[list[dict[str, Any]], int]:
        with self.changed:
            items = [copy.deepcopy(found) for (resource, space, _), found in sorted(self.objects.items())
                     if resource == kind.resource and space == namespace
                     and matches(requirements, found["metadata"].get("labels"))]
            return items, self.revision

    def events_after(self, kind: ResourceType, namespace: str, revision: int) -> list[Event]:
        with self.changed:
            if revision < self.oldest_watchable - 1:
                raise status.ApiError(410, "Expired", "")
            return [event for event in self.events
                    if event.revision > revision and event.resource == kind.resource
                    and event.namespace == namespace]

    # -- writes ------------------------------------------------------------------

    def _commit(self, kind: ResourceType, namespace: str, name: str,
                new: dict[str, Any] | None) -> None:
        """Store ``new`` (None deletes) under the next revision; wake the watchers. Lock held."""
        key = (kind.resource, namespace, name)
        old = self.objects.get(key)
        self.revision += 1
        if new is None:
            self.objects.pop(key, None)
        else:
            new["metadata"]["resourceVersion"] = str(self.revision)
            self.objects[key] = new
        self.events.append(Event(self.revision, kind.resource, namespace,
                                 copy.deepcopy(old), copy.deepcopy(new)))
        self.changed.notify_all()

    def validated(self, kind: ResourceType, body: dict[str, Any]) -> dict[str, Any]:
        """The body pruned to the schema; 422 Invalid with every cause if it does not fit."""
        metadata = body.get("metadata") or {}
        causes: list[Cause] = metadata_causes(metadata)
        content = {key: value for key, value in body.items()
                   if key not in ("apiVersion", "kind", "metadata")}
        pruned, schema_causes = prune_and_validate(content, kind.schema, "")
        causes += schema_causes
        if causes:
            raise status.invalid(kind.kind, kind.group, str(metadata.get("name") or ""), causes)
        return {"apiVersion": body["apiVersion"], "kind": body["kind"], "metadata": metadata,
                **pruned}

    def create(self, kind: ResourceType, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        metadata = body.setdefault("metadata", {})
        if kind.status_subresource:
            body.pop("status", None)  # with a status subresource, create ignores status
        stored = self.validated(kind, body)
        name = metadata["name"]
        metadata.update(namespace=namespace, uid=str(uuid.uuid4()), generation=1,
                        creationTimestamp=_now())
        for server_field in ("deletionTimestamp", "resourceVersion"):
            metadata.pop(server_field, None)
        with self.changed:
            if (kind.resource, namespace, name) in self.objects:
                raise status.already_exists(kind.resource, kind.group, kind.plural, name)
            self._commit(kind, namespace, name, stored)
            self.created.append(name)
            return copy.deepcopy(stored)

    def patch(self, kind: ResourceType, namespace: str, name: str, patch: Any,
              subresource: str | None = None) -> dict[str, Any]:
        """A merge patch; on the main resource status is ignored, on ``status`` only status counts."""
        if not isinstance(patch, dict):
            raise status.bad_request("a merge patch must be a JSON object")
        with self.changed:
            current = self.get(kind, namespace, name)
            wanted_version = (patch.get("metadata") or {}).get("resourceVersion")
            if wanted_version is not None and wanted_version != current["metadata"]["resourceVersion"]:
                raise status.conflict(kind.resource, kind.group, kind.plural, name,
                                      "the object has been modified; please apply your changes "
                                      "to the latest version and try again")
            merged = merge_patch(current, patch)
            if kind.status_subresource:
                # The main resource ignores status changes; /status ignores everything else.
                source, base = (merged, current) if subresource == "status" else (current, merged)
                merged = {**base}
                merged.pop("status", None)
                if "status" in source:
                    merged["status"] = source["status"]
                if subresource == "status":
                    merged["metadata"] = current["metadata"]
            for immutable in ("name", "namespace", "uid", "creationTimestamp", "deletionTimestamp",
                              "generation"):
                if immutable in current["metadata"]:
                    merged["metadata"][immutable] = current["metadata"][immutable]
                else:
                    merged["metadata"].pop(immutable, None)
            merged = self.validated(kind, merged)
            if merged.get("spec") != current.get("spec"):
                merged["metadata"]["generation"] = current["metadata"]["generation"] + 1
            if merged == current:
                return current  # a no-op patch writes nothing, as on a real server
            if merged["metadata"].get("deletionTimestamp") and not merged["metadata"].get("finalizers"):
                self._commit(kind, namespace, name, None)  # the last finalizer went
            else:
                self._commit(kind, namespace, name, merged)
            return copy.deepcopy(merged)

    def delete(self, kind: ResourceType, namespace: str, name: str,
               options: Mapping[str, Any]) -> dict[str, Any]:
        """Delete now, or mark for deletion while finalizers remain (deletionTimestamp)."""
        preconditions = options.get("preconditions") or {}
        with self.changed:
            current = self.get(kind, namespace, name)
            metadata = current["metadata"]
            for key, label in (("uid", "UID"), ("resourceVersion", "ResourceVersion")):
                wanted = preconditions.get(key)
                if wanted is not None and wanted != metadata[key]:
                    raise status.conflict(
                        kind.resource, kind.group, kind.plural, name,
                        f"Precondition failed: {label} in precondition: {wanted}, "
                        f"{label} in object meta: {metadata[key]}")
            if metadata.get("finalizers"):
                if not metadata.get("deletionTimestamp"):
                    metadata.update(deletionTimestamp=_now(), deletionGracePeriodSeconds=0)
                    self._commit(kind, namespace, name, current)
                return copy.deepcopy(current)
            self._commit(kind, namespace, name, None)
            return current

    def compact(self) -> None:
        """Forget the history, as etcd compaction does: older watches get 410 Expired."""
        with self.changed:
            self.events.clear()
            self.oldest_watchable = self.revision + 1

    def all_objects(self) -> Iterator[dict[str, Any]]:
        with self.changed:
            yield from (copy.deepcopy(found) for found in self.objects.values())
