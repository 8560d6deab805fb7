"""A `conclave serve` subprocess spoken to over stdio, with a config aimed at a SimPanel."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import anyio
import orjson
import yaml
from anyio.abc import Process
from anyio.streams.buffered import BufferedByteReceiveStream

from conclave.app.sim import SimPanel

SERVE = ["serve"]
PRICE = {"input_per_mtok": 1.0, "output_per_mtok": 4.0}


def panel_providers(panel: SimPanel, price: dict[str, float] = PRICE) -> dict[str, dict[str, Any]]:
    """Three simulated members, alpha, beta and gamma, one per wire kind."""
    kinds = {"alpha": "openai", "beta": "anthropic", "gamma": "gemini"}
    return {
        name: {"kind": kind, "model": f"m-{name}", "base_url": panel.base_url(kind), "price": price}
        for name, kind in kinds.items()
    }


def panel_config(panel: SimPanel, tmp_path: Path, **extra: Any) -> Path:
    """Three simulated members, one per wire kind; telemetry and transcripts in tmp_path."""
    providers = panel_providers(panel)
    data = {
        "providers": providers,
        "panel": ["alpha", "beta", "gamma"],
        "roles": {
            "proposer": "alpha",
            "critics": ["beta", "gamma"],
            "synthesizer": "beta",
            "synthesizer_fallbacks": ["gamma"],
        },
        "limits": {"retry": {"max_attempts": 1}},
        "telemetry": {"path": str(tmp_path / "events.ndjson")},
        "transcripts": {"dir": str(tmp_path / "transcripts")},
        **extra,
    }
    path = tmp_path / "serve.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


class StdioServer:
    def __init__(self, process: Process) -> None:
        self.process = process
        assert process.stdout is not None and process.stdin is not None
        self._out = BufferedByteReceiveStream(process.stdout)

    async def send(self, message: Any) -> None:
        data = message if isinstance(message, bytes) else orjson.dumps(message)
        assert self.process.stdin is not None
        await self.process.stdin.send(data + b"\n")

    async def recv(self, seconds: float = 20) -> Any:
        with anyio.fail_after(seconds):
            line = await self._out.receive_until(b"\n", 64 * 1024 * 1024)
        return orjson.loads(line)

    async def request(self, method: str, params: Any = None, *, id: Any = 1) -> Any:
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": id, "method": method}
        if params is not None:
            message["params"] = params
        await self.send(message)
        return await self.recv()

    async def initialize(self, version: str = "2025-11-25") -> Any:
        """The handshake era's `initialize`, as a client opens a session (id 0)."""
        params = {"protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}
        return await self.request("initialize", params, id=0)

    async def close(self) -> int:
        assert self.process.stdin is not None
        await self.process.stdin.aclose()
        with anyio.fail_after(20):
            return await self.process.wait()


async def start_server(config: Path, cwd: Path) -> StdioServer:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    process = await anyio.open_process(
        [sys.executable, "-m", "conclave", *SERVE, "--config", str(config)], cwd=cwd, env=env
    )
    return StdioServer(process)
