"""Validate simulator responses against the official Vast OpenAPI files (vendored in tests/sim/vast-openapi/)."""

from __future__ import annotations

import copy
import functools
import os
from pathlib import Path
from typing import Any

import yaml
from openapi_schema_validator import OAS30Validator

SPEC_DIR = Path(os.environ.get("VAST_OPENAPI_DIR", Path(__file__).resolve().parent / "vast-openapi"))


@functools.cache
def _document(name: str) -> dict[str, Any]:
    return yaml.safe_load((SPEC_DIR / name).read_text())


def _inline(node: Any, doc: dict[str, Any]) -> Any:
    if isinstance(node, dict):
        if "$ref" in node:
            target: Any = doc
            for part in node["$ref"].lstrip("#/").split("/"):
                target = target[part]
            return _inline(target, doc)
        return {k: _inline(v, doc) for k, v in node.items()}
    if isinstance(node, list):
        return [_inline(v, doc) for v in node]
    return node


def response_schema(name: str, path: str, method: str, status: int) -> dict[str, Any]:
    doc = _document(name)
    response = doc["paths"][path][method.lower()]["responses"][str(status)]
    schema = copy.deepcopy(_inline(response["content"]["application/json"]["schema"], doc))
    if name == "show_instance.yaml" and status == 200:
        # show_instance.yaml disagrees with show_instances.yaml (and with Vast's wire, docs/vast-behaviours.md)
        # on two fields of the same object: `ports` is a {"22/tcp": [{HostIp, HostPort}]} dict or null,
        # `extra_env` a list of [key, value] pairs. Take the list endpoint's (correct) definitions.
        item = _document("show_instances.yaml")["paths"]["/api/v1/instances/"]["get"]["responses"]["200"]
        fields = item["content"]["application/json"]["schema"]["properties"]["instances"]["items"]["properties"]
        for key in ("ports", "extra_env"):
            schema["properties"]["instances"]["properties"][key] = fields[key]
        schema["properties"]["instances"]["nullable"] = True  # destroyed or not yet visible: null
    return schema


def validate(body: Any, name: str, path: str, method: str, status: int) -> None:
    """Raise jsonschema.ValidationError when `body` does not match the documented response."""
    OAS30Validator(response_schema(name, path, method, status)).validate(body)


def strict_properties(schema: dict[str, Any]) -> set[str]:
    """The documented property names of an object schema (to check we send every documented field)."""
    return set(schema.get("properties", {}))
