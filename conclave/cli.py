"""`conclave` command line. Every command takes `--config` (and `--set section.key=value`)."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import anyio
import orjson

from conclave import __version__
from conclave.config import Config, load_config
from conclave.doctor import ProviderCheck, check_providers, providers_in_use
from conclave.errors import ConfigError, InvalidArguments, ToolError
from conclave.runtime import Runtime, open_runtime
from conclave.simulated import simulated_config
from conclave.tools import build_registry

# Commands the SPEC names that later issues build; each says so instead of pretending.
PLANNED = {
    "serve": ("run the JSON-RPC / MCP server (stdio; --http HOST:PORT)", "F5"),
    "confer": ("ask every provider in the panel the same question, in parallel", "F4/F5"),
    "coordinate": ("run a proposer -> critics -> synthesizer debate", "F4/F5"),
    "tail": ("follow the event log with filters", "F5"),
    "demo": ("run confer and coordinate end to end against the simulated panel", "F5"),
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        return handler(args)
    except ConfigError as exc:
        print(f"conclave: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="conclave",
        description="Multi-model deliberation: ask a panel of LLMs at once, or run a debate.",
    )
    parser.add_argument("--version", action="version", version=f"conclave {__version__}")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--config",
        metavar="PATH",
        help="config file (default: $CONCLAVE_CONFIG, ./config.yaml, then the packaged default)",
    )
    common.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override one config value (repeatable)",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    providers = sub.add_parser("providers", parents=[common], help="list configured providers")
    providers.add_argument("--json", action="store_true", help="print JSON")
    providers.set_defaults(handler=cmd_providers)

    doctor = sub.add_parser(
        "doctor", parents=[common], help="check config and keys, and make one tiny call per provider"
    )
    doctor.add_argument(
        "--simulated",
        action="store_true",
        help="check against the built-in simulated panel (no API key needed)",
    )
    doctor.add_argument("--timeout", type=float, default=30.0, metavar="SECONDS")
    doctor.add_argument("--json", action="store_true", help="print JSON")
    doctor.set_defaults(handler=cmd_doctor)

    fetch = sub.add_parser("fetch", parents=[common], help="fetch one URL under the fetch policies")
    fetch.add_argument("url")
    fetch.add_argument("--max-bytes", type=int, metavar="N")
    fetch.add_argument("--session", metavar="ID", help="session whose egress budget to spend")
    fetch.add_argument("--json", action="store_true", help="print the structured result")
    fetch.set_defaults(handler=cmd_fetch)

    verify = sub.add_parser("verify", parents=[common], help="run deterministic checks")
    verify.add_argument(
        "--checks",
        required=True,
        metavar="FILE|-",
        help="JSON file holding the checks array (or {'checks': [...]}); - reads stdin",
    )
    verify.add_argument("--json", action="store_true", help="print the structured result")
    verify.set_defaults(handler=cmd_verify)

    sim = sub.add_parser("sim", parents=[common], help="run the simulated panel as a server")
    sim.add_argument("--host", default="127.0.0.1")
    sim.add_argument("--port", type=int, default=8900)
    sim.add_argument("--latency-ms", type=float, default=0.0)
    sim.set_defaults(handler=cmd_sim)

    for name, (summary, issue) in PLANNED.items():
        planned = sub.add_parser(name, parents=[common], help=f"{summary} [not built yet]")
        planned.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
        planned.set_defaults(handler=_not_built(name, issue))
    return parser


def _not_built(name: str, issue: str) -> Callable[[argparse.Namespace], int]:
    def handler(_args: argparse.Namespace) -> int:
        print(f"conclave {name}: not implemented yet (planned in issue {issue})", file=sys.stderr)
        return 2

    return handler


def _load(args: argparse.Namespace) -> Config:
    return load_config(args.config, overrides=args.overrides)


def cmd_providers(args: argparse.Namespace) -> int:
    config = _load(args)
    in_use = providers_in_use(config)
    rows = [
        {
            "name": name,
            "kind": p.kind,
            "model": p.model,
            "api_key_env": p.api_key_env,
            "key_present": config.key_present(name),
            "in_panel": name in config.panel,
            "in_use": name in in_use,
            "breaker": "closed",
        }
        for name, p in config.providers.items()
    ]
    if args.json:
        sys.stdout.write(orjson.dumps(rows, option=orjson.OPT_INDENT_2).decode() + "\n")
        return 0
    print(f"config: {config.source}")
    table = [["NAME", "KIND", "MODEL", "KEY", "PANEL", "BREAKER"]]
    for row in rows:
        key = (
            "not needed"
            if row["api_key_env"] is None
            else ("yes" if row["key_present"] else f"no (set {row['api_key_env']})")
        )
        table.append(
            [
                str(row["name"]),
                str(row["kind"]),
                str(row["model"]),
                key,
                "yes" if row["in_panel"] else "no",
                str(row["breaker"]),
            ]
        )
    _print_table(table)
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    config = _load(args)
    checks = anyio.run(_doctor, config, args.simulated, args.timeout)
    if args.json:
        payload = [_check_dict(c) for c in checks]
        sys.stdout.write(orjson.dumps(payload, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        _print_doctor(config, checks, args.simulated)
    return 1 if any(c.broken for c in checks) else 0


async def _doctor(config: Config, simulated: bool, seconds: float) -> list[ProviderCheck]:
    async with _maybe_simulated(config, simulated) as effective, open_runtime(effective) as rt:
        return await check_providers(rt, timeout_seconds=seconds)


@contextlib.asynccontextmanager
async def _maybe_simulated(config: Config, simulated: bool) -> AsyncIterator[Config]:
    if not simulated:
        yield config
        return
    from conclave.sim import SimPanel

    async with SimPanel() as panel:
        urls = {kind: panel.base_url(kind) for kind in ("openai", "anthropic", "gemini")}
        yield simulated_config(config, urls)


def _check_dict(check: ProviderCheck) -> dict[str, Any]:
    return {
        "name": check.name,
        "kind": check.kind,
        "model": check.model,
        "in_use": check.in_use,
        "verdict": check.verdict,
        "detail": check.detail,
        "broken": check.broken,
    }


def _print_doctor(config: Config, checks: list[ProviderCheck], simulated: bool) -> None:
    label = " [SIMULATED PANEL: no real provider is called]" if simulated else ""
    print(f"config: {config.source} (valid){label}")
    table = [["PROVIDER", "KIND", "MODEL", "USED", "VERDICT", "DETAIL"]]
    for c in checks:
        verdict = "ok" if c.verdict == "ok" else ("FAIL" if c.in_use else "warn")
        table.append(
            [
                c.name,
                c.kind,
                c.model,
                "yes" if c.in_use else "no",
                verdict,
                c.detail if c.verdict == "ok" else f"{c.verdict}: {c.detail}",
            ]
        )
    _print_table(table)
    broken = [c.name for c in checks if c.broken]
    if broken:
        print(f"verdict: BROKEN - providers in use that fail: {', '.join(broken)}")
    else:
        print("verdict: ok - every provider in use answered")


def cmd_fetch(args: argparse.Namespace) -> int:
    tool_args: dict[str, Any] = {"url": args.url}
    if args.max_bytes is not None:
        tool_args["max_bytes"] = args.max_bytes
    if args.session:
        tool_args["session_id"] = args.session
    return _run_tool(args, "fetch", tool_args, failed=lambda _result: False)


def cmd_verify(args: argparse.Namespace) -> int:
    source = sys.stdin.read() if args.checks == "-" else Path(args.checks).read_text(encoding="utf-8")
    try:
        parsed = orjson.loads(source)
    except orjson.JSONDecodeError as exc:
        print(f"conclave verify: {args.checks} is not JSON: {exc}", file=sys.stderr)
        return 2
    tool_args = parsed if isinstance(parsed, dict) else {"checks": parsed}
    return _run_tool(args, "verify", tool_args, failed=lambda result: not result["passed"])


def _run_tool(
    args: argparse.Namespace, name: str, tool_args: dict[str, Any], failed: Callable[[dict[str, Any]], bool]
) -> int:
    """Run one tool; exit 0 on success, 1 on a refusal or failed checks, 2 on bad arguments."""
    config = _load(args)

    async def run() -> dict[str, Any]:
        async with open_runtime(config) as runtime:
            return await runtime.call_tool(name, tool_args)

    try:
        result = anyio.run(run)
    except InvalidArguments as exc:
        print(f"conclave {name}: invalid arguments at {exc.path}: {exc.message}", file=sys.stderr)
        return 2
    except ToolError as exc:
        print(f"conclave {name}: {exc.message}", file=sys.stderr)
        return 1
    if args.json:
        sys.stdout.write(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        print(build_registry().get(name).render(result))
    return 1 if failed(result) else 0


def cmd_sim(args: argparse.Namespace) -> int:
    from conclave.sim.__main__ import main as sim_main

    status: int = sim_main(
        ["--host", args.host, "--port", str(args.port), "--latency-ms", str(args.latency_ms)]
    )
    return status


def _print_table(rows: list[list[str]]) -> None:
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        cells = [str(cell).ljust(width) for cell, width in zip(row, widths, strict=True)]
        print("  ".join(cells).rstrip())


__all__ = ["Runtime", "build_parser", "main"]
