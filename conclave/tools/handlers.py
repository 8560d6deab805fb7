"""The worker tools' handlers, as `conclave.tools.spec` names them. Each tool's module is imported
on its first use: most calls use neither tool, and the two with what they import would otherwise
load into every process and slow `conclave serve`'s start-up."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from conclave.tools.spec import ToolInvocation


async def run_fetch(args: Mapping[str, Any], invocation: ToolInvocation) -> dict[str, Any]:
    from conclave.tools.fetch import fetch

    return await fetch(args, invocation.context)


async def run_verify(args: Mapping[str, Any], _invocation: ToolInvocation) -> dict[str, Any]:
    from conclave.tools.verify import run_verify as verify

    return await verify(args)
