"""Every file in schemas/ is a valid JSON Schema (the runtime no longer re-checks them at start-up)."""

from __future__ import annotations

from pathlib import Path

import jsonschema
import orjson
import pytest

from conclave.schemas import schema_dir

SCHEMAS = sorted(p for p in Path(schema_dir()).rglob("*.json"))


def test_there_are_schemas_to_check() -> None:
    assert len(SCHEMAS) >= 30


@pytest.mark.parametrize("path", SCHEMAS, ids=lambda p: str(p.relative_to(schema_dir())))
def test_each_schema_is_valid_against_its_metaschema(path: Path) -> None:
    schema = orjson.loads(path.read_bytes())
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    cls.check_schema(schema)
