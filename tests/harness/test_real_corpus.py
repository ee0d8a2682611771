"""Real response shapes parse through the client's models: the example payloads of the official OpenAPI
files (tests/sim/vast-openapi/) and the shapes the official CLI's tests feed its commands (vendored)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.sim.openapi import SPEC_DIR, _document, _inline
from vast_harness.instance.absence import is_lingering
from vast_harness.vast.models import CreateResult, Instance, InstancePage, Offer, User

CLI = json.loads((Path(__file__).parent / "fixtures" / "vast_cli_shapes.json").read_text())


def example_of(schema: dict[str, Any]) -> Any:
    """An object built from a schema's own examples (the OpenAPI files give them per property)."""
    if "example" in schema:
        return schema["example"]
    if schema.get("type") == "array" or "items" in schema:
        return [example_of(schema.get("items", {}))]
    if schema.get("type") == "object" or "properties" in schema:
        return {k: example_of(v) for k, v in schema.get("properties", {}).items()}
    for key in ("allOf", "oneOf", "anyOf"):
        if key in schema:
            return example_of(schema[key][0])
    # no example given: a value of the declared type, so required fields are present
    return {"integer": 1, "number": 1.0, "string": "x", "boolean": True}.get(schema.get("type"))


def ok_example(name: str, path: str, method: str) -> Any:
    doc = _document(name)
    content = doc["paths"][path][method]["responses"]["200"]["content"]["application/json"]
    return example_of(_inline(content["schema"], doc)) if "example" not in content else content["example"]


def _paths(name: str) -> tuple[str, str]:
    doc = _document(name)
    path = next(iter(doc["paths"]))
    return path, next(m for m in doc["paths"][path] if m in ("get", "put", "post", "delete"))


def test_the_openapi_files_are_there() -> None:
    assert (SPEC_DIR / "show_instances.yaml").is_file()


def test_search_example_parses() -> None:
    body = ok_example("search_offers.yaml", *_paths("search_offers.yaml"))
    rows = body["offers"] if isinstance(body["offers"], list) else [body["offers"]]  # the file shows one object
    offers = [Offer.model_validate(o) for o in rows]
    assert offers and offers[0].id


def test_show_instance_example_parses() -> None:
    body = ok_example("show_instance.yaml", *_paths("show_instance.yaml"))
    inst = Instance.model_validate(body["instances"])
    assert inst.id and (inst.dph_total is None or inst.dph_total >= 0)


def test_show_instances_example_parses() -> None:
    page = InstancePage.model_validate(ok_example("show_instances.yaml", *_paths("show_instances.yaml")))
    assert page.instances and page.instances[0].id


def test_user_and_create_examples_parse() -> None:
    assert User.model_validate(ok_example("show_user.yaml", *_paths("show_user.yaml"))).available_usd >= 0
    assert CreateResult.model_validate(ok_example("create_instance.yaml", *_paths("create_instance.yaml"))).new_contract


def test_cli_offer_shapes_parse() -> None:
    offer = Offer.model_validate(CLI["offers"][0])
    assert offer.machine_id == 42 and offer.dph_total == 0.5  # machine_id arrives as a string there


@pytest.mark.parametrize(("name", "failed", "lingering"), [
    ("running", False, False), ("manifest_missing", True, False), ("oci_failed", True, False),
    ("build_error", True, False), ("destroyed", False, True),
])
def test_cli_instance_shapes_parse_and_classify(name: str, failed: bool, lingering: bool) -> None:
    inst = Instance.model_validate(CLI["instances"][name])
    assert (inst.failed_reason is not None) == failed
    assert is_lingering(inst) == lingering
