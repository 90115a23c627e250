"""What a real API server checks before it stores an object, with its own wording.

Names (DNS-1123 subdomains), label keys and values, annotation keys, label
selectors, the CRD's structural schema (types, required fields, enums, with
unknown fields pruned as a real server prunes them) and JSON merge patches.
The messages are those of k8s.io/apimachinery, so a test can assert what a
user of a real cluster would read.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_NAME_PART = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
SUBDOMAIN_MESSAGE = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or "
    "'.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used "
    "for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
_NAME_PART_MESSAGE = (
    "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end "
    "with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for "
    "validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
)
_LABEL_VALUE_MESSAGE = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or "
    "'.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',"
    "  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"
)
MAX_ANNOTATIONS_BYTES = 256 * 1024


@dataclass(frozen=True)
class Cause:
    """One field error, as in a Status body's ``details.causes``."""

    field: str
    message: str
    reason: str = "FieldValueInvalid"

    def to_dict(self) -> dict[str, str]:
        return {"reason": self.reason, "message": self.message, "field": self.field}


def name_errors(name: Any) -> list[str]:
    if not isinstance(name, str) or not name:
        return ["name or generateName is required"]
    errors = []
    if len(name) > 253:
        errors.append("must be no more than 253 characters")
    if not _SUBDOMAIN.match(name):
        errors.append(SUBDOMAIN_MESSAGE)
    return errors


def qualified_name_errors(key: str) -> list[str]:
    """A label or annotation key: ``[prefix/]name``, prefix a DNS subdomain."""
    prefix, _, name = key.rpartition("/") if "/" in key else ("", "", key)
    errors = []
    if "/" in key and (not prefix or len(prefix) > 253 or not _SUBDOMAIN.match(prefix)):
        errors.append(f"prefix part {SUBDOMAIN_MESSAGE}")
    if not name:
        errors.append("name part must be non-empty")
    elif len(name) > 63:
        errors.append("name part must be no more than 63 characters")
    elif not _NAME_PART.match(name):
        errors.append(_NAME_PART_MESSAGE)
    return errors


def label_value_errors(value: str) -> list[str]:
    errors = []
    if len(value) > 63:
        errors.append("must be no more than 63 characters")
    if not _LABEL_VALUE.match(value):
        errors.append(_LABEL_VALUE_MESSAGE)
    return errors


def metadata_causes(metadata: Mapping[str, Any]) -> list[Cause]:
    """Errors in the name, labels and annotations of an object's metadata."""
    causes = [Cause("metadata.name", f'Invalid value: {metadata.get("name")!r}: {message}')
              for message in name_errors(metadata.get("name"))]
    for kind in ("labels", "annotations"):
        entries = metadata.get(kind) or {}
        if not isinstance(entries, dict):
            causes.append(Cause(f"metadata.{kind}", "Invalid value: must be a map of strings"))
            continue
        for key, value in entries.items():
            field = f"metadata.{kind}"
            causes += [Cause(field, f'Invalid value: "{key}": {message}')
                       for message in qualified_name_errors(key)]
            if not isinstance(value, str):
                causes.append(Cause(field, f'Invalid value: "{key}": value must be a string'))
            elif kind == "labels":
                causes += [Cause(field, f'Invalid value: "{value}": {message}')
                           for message in label_value_errors(value)]
        if kind == "annotations" and sum(len(k) + len(str(v)) for k, v in entries.items()) \
                > MAX_ANNOTATIONS_BYTES:
            causes.append(Cause("metadata.annotations",
                                f"Too long: must have at most {MAX_ANNOTATIONS_BYTES} bytes",
                                "FieldValueTooLong"))
    return causes


# -- label selectors -------------------------------------------------------------

Requirement = Callable[[Mapping[str, str]], bool]


class SelectorError(ValueError):
    pass


_EXISTS = re.compile(r"^\s*(!?)\s*([^\s!=()]+)\s*$")
_EQUALS = re.compile(r"^\s*([^\s!=()]+)\s*(==|=|!=)\s*([^\s!=(),]*)\s*$")
_SET = re.compile(r"^\s*([^\s!=()]+)\s+(in|notin)\s+\(([^()]*)\)\s*$")


def _split_requirements(selector: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for character in selector:
        depth += {"(": 1, ")": -1}.get(character, 0)
        if character == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += character
    parts.append(current)
    return parts


def _checked(key: str, values: list[str]) -> None:
    problems = qualified_name_errors(key)
    for value in values:
        problems += label_value_errors(value)
    if problems:
        raise SelectorError(f"unable to parse requirement: key {key!r}: {'; '.join(problems)}")


def parse_selector(selector: str | None) -> list[Requirement]:
    """Parse a label selector as the API server does; SelectorError if it cannot."""
    if selector is None or not selector.strip():
        return []
    requirements: list[Requirement] = []
    for text in _split_requirements(selector):
        if (match := _SET.match(text)) is not None:
            key, operator, listed = match.groups()
            values = [value.strip() for value in listed.split(",")]
            _checked(key, values)
            wanted = operator == "in"
            requirements.append(
                lambda labels, k=key, v=frozenset(values), w=wanted: (labels.get(k) in v) == w
            )
        elif (match := _EQUALS.match(text)) is not None:
            key, operator, value = match.groups()
            _checked(key, [value])
            negated = operator == "!="
            requirements.append(
                lambda labels, k=key, v=value, n=negated: (labels.get(k) == v) != n
            )
        elif (match := _EXISTS.match(text)) is not None:
            negation, key = match.groups()
            _checked(key, [])
            requirements.append(lambda labels, k=key, n=bool(negation): (k in labels) != n)
        else:
            raise SelectorError(f"unable to parse requirement: found {text.strip()!r}, "
                                "expected: key, !key, key=value, key!=value, key in (…)")
    return requirements


def matches(requirements: list[Requirement], labels: Mapping[str, str] | None) -> bool:
    return all(requirement(labels or {}) for requirement in requirements)


# -- the CRD's structural schema -------------------------------------------------

_TYPES: dict[str, Callable[[Any], bool]] = {
    "object": lambda value: isinstance(value, dict),
    "array": lambda value: isinstance(value, list),
    "string": lambda value: isinstance(value, str),
    "integer": lambda value: isinstance(value, int) and not isinstance(value, bool),
    "number": lambda value: isinstance(value, int | float) and not isinstance(value, bool),
    "boolean": lambda value: isinstance(value, bool),
}


def _shown(value: Any) -> str:
    return f'"{value}"' if isinstance(value, str) else repr(value)


def _type_name(value: Any) -> str:
    for name in ("boolean", "integer", "number", "string", "array", "object"):
        if _TYPES[name](value):
            return name
    return "null"


def prune_and_validate(value: Any, schema: Mapping[str, Any], path: str) -> tuple[Any, list[Cause]]:
    """``value`` with unknown fields dropped, and what is wrong with it (structural schema)."""
    if value is None and schema.get("nullable"):
        return None, []
    wanted = schema.get("type")
    if wanted is not None and not _TYPES[wanted](value):
        return value, [Cause(path, f"Invalid value: {_shown(value)}: {path} in body must be of "
                                   f"type {wanted}: {_shown(_type_name(value))}", "FieldValueTypeInvalid")]
    causes: list[Cause] = []
    if "enum" in schema and value not in schema["enum"]:
        supported = ", ".join(_shown(option) for option in schema["enum"])
        causes.append(Cause(path, f"Unsupported value: {_shown(value)}: supported values: {supported}",
                            "FieldValueNotSupported"))
    if isinstance(value, dict):
        properties: Mapping[str, Any] = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        keep_unknown = bool(schema.get("x-kubernetes-preserve-unknown-fields"))
        pruned = {}
        for key, item in value.items():
            item_schema = properties.get(key, extra if isinstance(extra, dict) else None)
            if item_schema is None:
                if keep_unknown or (wanted is None and not properties):
                    pruned[key] = item
                continue  # pruned, as a real server prunes fields the schema does not know
            item_path = f"{path}.{key}" if path else key
            pruned[key], item_causes = prune_and_validate(item, item_schema, item_path)
            causes += item_causes
        for key in schema.get("required") or []:
            if key not in value:
                causes.append(Cause(f"{path}.{key}" if path else key, "Required value",
                                    "FieldValueRequired"))
        return pruned, causes
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        items = []
        for index, item in enumerate(value):
            checked, item_causes = prune_and_validate(item, schema["items"], f"{path}[{index}]")
            items.append(checked)
            causes += item_causes
        return items, causes
    return value, causes


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: what ``application/merge-patch+json`` means."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result
