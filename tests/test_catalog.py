"""One specification per tool: the server, the worker registry and the CLI read the catalog."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest

from conclave.app.catalog import TOOL_NAMES, TOOLS, ToolSpec, tool_spec
from conclave.app.runtime import open_runtime
from conclave.app.server.core import PLAIN_METHODS
from conclave.core.errors import InvalidArguments, UnknownTool
from conclave.schema import schemas
from conclave.schema.config import Config
from conclave.tools.registry import build_registry
from conclave.tools.spec import _load

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("tool", TOOLS, ids=TOOL_NAMES)
def test_every_tool_names_a_handler_a_renderer_and_two_schemas_that_exist(tool: ToolSpec) -> None:
    assert callable(_load(tool.handler_path)) and callable(_load(tool.renderer_path))
    assert tool.input_schema["type"] == "object" and tool.output_schema["type"] == "object"


def test_the_worker_registry_and_the_plain_methods_come_from_the_catalog() -> None:
    assert build_registry().names() == ("fetch", "verify")
    assert frozenset(TOOL_NAMES) == PLAIN_METHODS


def test_an_unknown_name_says_which_tools_exist() -> None:
    with pytest.raises(UnknownTool, match="known tools: confer, coordinate"):
        tool_spec("nope")


def test_invalid_arguments_name_the_failing_path() -> None:
    with pytest.raises(InvalidArguments) as info:
        tool_spec("fetch").validate({"url": 5})
    assert (info.value.path, info.value.tool) == ("$.url", "fetch")


def test_the_catalog_imports_no_tool_and_no_runtime() -> None:
    """What lets a starting server answer `tools/list` before the runtime loads."""
    heavy = ["httpx", "aiohttp", "structlog", "conclave.app.runtime", "conclave.deliberation", "conclave.tools.context",
             "conclave.tools.registry", "conclave.tools.handlers"]
    probe = f"import sys, conclave.app.catalog\nprint([m for m in {heavy!r} if m in sys.modules])\n"
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]"


async def test_the_registry_runs_a_tool_without_checking_its_arguments_again(
    make_config: Callable[..., Config], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its callers (the server's door, the worker loop's vetting) have checked them already."""
    config = make_config({"a": {"kind": "openai", "model": "m", "base_url": "http://127.0.0.1:9/v1"}})
    checked: list[str] = []
    real_acceptor = schemas.acceptor

    def counting(relative: str) -> Any:
        checked.append(relative)
        return real_acceptor(relative)

    async with open_runtime(config) as rt:
        monkeypatch.setattr(schemas, "acceptor", counting)
        result = await rt.tools.call(
            "verify", {"checks": [{"type": "equals", "actual": 1, "expected": 1}]}, rt.tool_context
        )
    assert result["passed"] is True
    assert checked == []
