"""Authentication (bearer tokens) and RBAC (a Role, e.g. deploy/rbac/worker-role.yaml)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from support.kube_api import status
from support.kube_api.store import REPOSITORY

WORKER_ROLE = REPOSITORY / "deploy" / "rbac" / "worker-role.yaml"
ANONYMOUS = "system:anonymous"


@dataclass(frozen=True)
class Rule:
    api_groups: frozenset[str]
    resources: frozenset[str]
    verbs: frozenset[str]

    def allows(self, verb: str, group: str, resource: str) -> bool:
        return (("*" in self.api_groups or group in self.api_groups)
                and ("*" in self.resources or resource in self.resources)
                and ("*" in self.verbs or verb in self.verbs))


@dataclass(frozen=True)
class Role:
    """A namespaced Role bound to one user (its RoleBinding's ServiceAccount)."""

    namespace: str
    user: str
    rules: tuple[Rule, ...]

    def allows(self, verb: str, group: str, resource: str, namespace: str) -> bool:
        return namespace == self.namespace and any(
            rule.allows(verb, group, resource) for rule in self.rules
        )

    def without(self, verb: str) -> Role:
        """The same Role missing one verb everywhere (to test what a narrower grant does)."""
        return Role(self.namespace, self.user, tuple(
            Rule(rule.api_groups, rule.resources, rule.verbs - {verb}) for rule in self.rules
        ))


def load_role(path: Path = WORKER_ROLE) -> Role:
    documents: list[Mapping[str, Any]] = [
        document for document in yaml.safe_load_all(path.read_text()) if document
    ]
    [role] = [document for document in documents if document["kind"] == "Role"]
    [binding] = [document for document in documents if document["kind"] == "RoleBinding"]
    [subject] = binding["subjects"]
    user = (f"system:serviceaccount:{subject['namespace']}:{subject['name']}"
            if subject["kind"] == "ServiceAccount" else subject["name"])
    rules = tuple(Rule(frozenset(rule.get("apiGroups") or []), frozenset(rule.get("resources") or []),
                       frozenset(rule.get("verbs") or []))
                  for rule in role.get("rules") or [])
    return Role(role["metadata"]["namespace"], user, rules)


@dataclass
class Access:
    """Who may call: no token configured means anyone (anonymous, all allowed)."""

    token: str | None = None
    role: Role | None = None

    def authenticate(self, authorization: str | None) -> str:
        if self.token is None:
            return ANONYMOUS
        if authorization != f"Bearer {self.token}":
            raise status.unauthorized()
        return self.role.user if self.role is not None else "admin"

    def authorize(self, user: str, verb: str, group: str, plural: str, subresource: str | None,
                  namespace: str, name: str | None) -> None:
        if self.role is None or user != self.role.user:
            return
        resource = f"{plural}/{subresource}" if subresource else plural
        if not self.role.allows(verb, group, resource, namespace):
            raise status.forbidden(user, verb, f"{resource}.{group}", group, resource, namespace,
                                   name)
