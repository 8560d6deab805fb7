"""`conclave` command line. Every command takes `--config` (and `--set section.key=value`)."""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import shlex
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

import anyio
import orjson

from conclave.app.catalog import tool_spec
from conclave.core.errors import ConfigError, InvalidArguments, PartialResult, ToolError
from conclave.core.version import __version__
from conclave.net.webguard import is_loopback
from conclave.schema.config import Config, load_config

# Each command imports what it runs on: `conclave serve` must answer its first request before the
# HTTP stack and the deliberation code are loaded (see server.lifecycle), and `--help` needs none.
if TYPE_CHECKING:
    from conclave.app.doctor import ProviderCheck
    from conclave.app.render import Deliberation, LiveProgress

DEFAULT_HTTP_PORT = 8765
DEFAULT_UI_PORT = 8780


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        return handler(args)
    except ConfigError as exc:
        print(f"conclave: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `conclave tail | head`: the reader has all it wanted
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    except OSError as exc:  # an unwritable event log, a full disk: one line, never a traceback
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"conclave: {where}{exc.strerror or exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


# A reader that closed the pipe early (`| head`) is not an error worth a message: exit as a
# process killed by SIGPIPE would, which is what shells and `set -o pipefail` expect.
EXIT_BROKEN_PIPE = 141
# The exit statuses of confer and coordinate (README): complete, degraded, bad arguments or
# config, and a result in which no model answered at all.
EXIT_OK, EXIT_DEGRADED, EXIT_USAGE, EXIT_NO_ANSWER = 0, 1, 2, 3


def _silence_stdout() -> None:
    """Point stdout at /dev/null so that the interpreter's final flush cannot raise again."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())


def _positive_seconds(text: str) -> float:
    """argparse type: a finite number of seconds above zero (NaN would never time out)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite number of seconds above 0")
    return value


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
    doctor.add_argument("--timeout", type=_positive_seconds, default=30.0, metavar="SECONDS")
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
    sim.add_argument("--caching", action="store_true", help="play each provider's prompt caching rule")
    sim.add_argument(
        "--stream-tokens-per-s",
        type=float,
        metavar="N",
        help="write streamed answers at N simulated tokens a second (default: at once)",
    )
    sim.add_argument(
        "--no-role-answers",
        action="store_true",
        help="answer role prompts (proposer, critic, reviewer, synthesizer) in plain text too",
    )
    sim.set_defaults(handler=cmd_sim)

    _add_confer(sub, common)
    _add_coordinate(sub, common)
    _add_eval(sub, common)
    _add_tail(sub, common)
    _add_serve(sub, common)
    _add_ui(sub, common)
    demo = sub.add_parser(
        "demo",
        parents=[common],
        help="run confer and coordinate with worker tools end to end against the simulated panel",
    )
    demo.add_argument(
        "--latency-ms", type=float, default=250.0, help="simulated model latency (default: 250)"
    )
    demo.add_argument(
        "--local",
        action="store_true",
        help="ask a real model on this machine instead: SmolLM2 on llama.cpp (docs/local-models.md)",
    )
    demo.set_defaults(handler=cmd_demo)
    return parser


Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def _add_confer(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    confer = sub.add_parser(
        "confer", parents=[common], help="ask every provider in the panel the same question, in parallel"
    )
    confer.add_argument("question", help="the question; - reads it from standard input")
    confer.add_argument("--providers", metavar="A,B", help="providers to ask (default: the panel)")
    confer.add_argument("--system", metavar="TEXT", help="system prompt for every panel member")
    confer.add_argument(
        "--review", action="store_true", help="then each member ranks the others' answers, blind"
    )
    confer.add_argument("--synthesize", action="store_true", help="then a chair writes the final answer")
    _add_answer_schema(confer, "each member", "; the result votes")
    confer.add_argument(
        "--vote-fields", metavar="A,B", help="answer fields to vote on besides booleans, numbers, enums"
    )
    confer.add_argument(
        "--tolerance", type=float, metavar="X", help="numbers within X times the larger agree (default 0)"
    )
    _add_quorum(confer, "members")
    confer.add_argument(
        "--on-partial",
        choices=("return", "error"),
        help="error: a result short of its members (or quorum) is an error, exit 1 (default: return)",
    )
    _add_call_options(confer)
    confer.set_defaults(handler=cmd_confer)


def _add_coordinate(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    coordinate = sub.add_parser(
        "coordinate", parents=[common], help="run a proposer -> critics -> synthesizer debate"
    )
    coordinate.add_argument("task", help="the task; - reads it from standard input")
    coordinate.add_argument("--proposer", metavar="NAME", help="default: roles.proposer")
    coordinate.add_argument("--critics", metavar="A,B", help="default: roles.critics")
    coordinate.add_argument("--synthesizer", metavar="NAME", help="default: roles.synthesizer")
    coordinate.add_argument("--rounds", type=int, metavar="N", help="1-3 (default 1)")
    coordinate.add_argument(
        "--all-rounds",
        action="store_true",
        help="run every round even after all critics accept (default: stop once they do)",
    )
    _add_answer_schema(coordinate, "the synthesizer", " as well as its answer")
    _add_quorum(coordinate, "critics of a round")
    _add_call_options(coordinate)
    coordinate.set_defaults(handler=cmd_coordinate)


def _add_quorum(parser: argparse.ArgumentParser, who: str) -> None:
    parser.add_argument(
        "--quorum", type=int, metavar="N", help=f"once N {who} answered, stop the rest after --grace"
    )
    parser.add_argument(
        "--grace", type=_positive_seconds, metavar="S", help="with --quorum: seconds the rest get (default 5)"
    )


def _add_answer_schema(parser: argparse.ArgumentParser, who: str, then: str) -> None:
    """`--choices`, `--number` or `--answer-schema`: the `answer_schema` argument (`_answer_schema`)."""
    shaped = parser.add_mutually_exclusive_group()
    shaped.add_argument("--choices", metavar="A,B,C", help=f"{who} picks one (and says why){then}")
    shaped.add_argument("--number", action="store_true", help=f"{who} answers a number{then}")
    shaped.add_argument(
        "--answer-schema",
        metavar="FILE|JSON",
        help=f"{who} answers a JSON object valid against this JSON Schema{then}",
    )


def _add_call_options(parser: argparse.ArgumentParser) -> None:
    """The options confer and coordinate share; each maps to one tool argument."""
    context = parser.add_mutually_exclusive_group()
    context.add_argument("--context", metavar="TEXT", help="background material sent with the question")
    context.add_argument(
        "--context-file", metavar="FILE|-", help="read the context from a file (- reads standard input)"
    )
    parser.add_argument("--worker-tools", metavar="fetch,verify", help="tools members may call mid-answer")
    parser.add_argument("--cost-cap", type=float, metavar="USD", help="worker tool cost cap per turn")
    parser.add_argument("--cost-cap-mode", choices=("warn", "enforce", "off"))
    parser.add_argument(
        "--worker-tool-mode",
        choices=("auto", "native", "tags"),
        help="how members call tools (default: config)",
    )
    parser.add_argument("--timeout", type=float, metavar="SECONDS", help="deadline for the whole call")
    parser.add_argument("--max-tokens", type=int, metavar="N", help="per model call")
    parser.add_argument("--temperature", type=float, metavar="T")
    parser.add_argument("--session", metavar="ID", help="session id (default: generated)")
    parser.add_argument(
        "--follow-up", metavar="SESSION", help="continue that session's thread: members see its earlier turns"
    )
    parser.add_argument("--dry-run", action="store_true", help="call nothing; print the plan and cost bound")
    parser.add_argument("--json", action="store_true", help="print the structured result only")


def _add_eval(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    run = sub.add_parser(
        "eval",
        parents=[common],
        help="measure the panel's strategies against its members on a suite (docs/eval.md)",
        description="Does the council beat its best member, at equal calls? Runs every strategy on "
        "every item of SUITE and reports accuracy with intervals, cost and latency (docs/eval.md).",
    )
    run.add_argument(
        "suite", nargs="?", metavar="SUITE", help="builtin:basic, a .jsonl suite or an MMLU-style .csv"
    )
    run.add_argument(
        "--demo", action="store_true", help="run builtin:basic twice on the simulated panel (no key)"
    )
    run.add_argument(
        "--strategies",
        metavar="LIST",
        help="single:NAME, sc:NAME:N, vote, council, coordinate (default: each single, vote, council)",
    )
    run.add_argument(
        "--budget", choices=("equal", "none"), default="equal", help="equal: singles get the panel's calls"
    )
    run.add_argument("--limit", type=_at_least(1), metavar="N", help="the first N items")
    run.add_argument("--concurrency", type=_at_least(1), default=4, metavar="C", help="items at once (4)")
    run.add_argument(
        "--max-cost", type=float, metavar="USD", help="refuse a run whose dry-run bound is above it"
    )
    run.add_argument("--out", metavar="DIR", help="where the files go (default: evals.dir/<date>-<suite>)")
    run.add_argument("--resume", action="store_true", help="skip what results.jsonl in --out already holds")
    run.add_argument("--seed", type=int, default=0, help="seeds the bootstrap and the demo's draws (0)")
    run.add_argument("--judges", metavar="a,b", help="who grades free-text items (default: the panel)")
    run.add_argument("--json", action="store_true", help="print summary.json instead of the table")
    run.set_defaults(handler=cmd_eval)


def _at_least(low: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{text!r} must be at least {low}")
        return value

    return parse


def _add_tail(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    tail = sub.add_parser("tail", parents=[common], help="show and follow the event log, with filters")
    tail.add_argument("-f", "--follow", action="store_true", help="keep printing events as they are appended")
    tail.add_argument(
        "--session", metavar="ID", help="only these sessions (ids or prefixes, comma-separated)"
    )
    tail.add_argument("--event", metavar="NAME", help="only these events (comma-separated)")
    tail.add_argument("--provider", metavar="NAME", help="only these providers (comma-separated)")
    tail.add_argument("--json", action="store_true", help="print the raw ndjson lines")
    tail.add_argument(
        "-n",
        "--lines",
        type=_line_count,
        default=20,
        metavar="N|all",
        help="past events to show (default 20)",
    )
    tail.set_defaults(handler=cmd_tail)


def _add_serve(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    serve = sub.add_parser(
        "serve", parents=[common], help="run the MCP / JSON-RPC server (stdio; --http HOST:PORT)"
    )
    serve.add_argument(
        "--http",
        metavar="HOST:PORT",
        help="serve MCP Streamable HTTP on /mcp and JSON-RPC on /rpc instead of stdio (e.g. 127.0.0.1:8765)",
    )
    serve.add_argument(
        "--workers",
        type=_worker_count,
        default=1,
        metavar="N",
        help="with --http: N processes accepting on the one port (they share state only through "
        "Redis: state.backend)",
    )
    # A worker of --workers: SO_REUSEPORT beside the others, and gone when this process is.
    serve.add_argument("--worker-of", type=int, metavar="PID", help=argparse.SUPPRESS)
    serve.set_defaults(handler=cmd_serve)


def _worker_count(value: str) -> int:
    if not value.isdigit() or not 1 <= int(value) <= 64:
        raise argparse.ArgumentTypeError(f"expected a number of processes from 1 to 64, got {value!r}")
    return int(value)


def _add_ui(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    ui = sub.add_parser(
        "ui", parents=[common], help="a local, read-only page of recent sessions, live while they run"
    )
    ui.add_argument(
        "--http",
        default=f"127.0.0.1:{DEFAULT_UI_PORT}",
        metavar="HOST:PORT",
        help=f"where to serve the page (default 127.0.0.1:{DEFAULT_UI_PORT}; port 0 picks a free one)",
    )
    ui.add_argument(
        "--allow-remote",
        action="store_true",
        help="allow a bind that other machines can reach (the page shows every question and answer)",
    )
    ui.set_defaults(handler=cmd_ui)


def _line_count(value: str) -> int | None:
    if value == "all":
        return None
    try:
        count = int(value)
    except ValueError:
        count = -1
    if count < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0 or 'all', got {value!r}")
    return count


def _load(args: argparse.Namespace) -> Config:
    return load_config(args.config, overrides=args.overrides)


def cmd_providers(args: argparse.Namespace) -> int:
    from conclave.app.doctor import providers_in_use
    from conclave.deliberation.session import tool_mode

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
            "tool_mode": tool_mode(None, p, config.worker_tools.mode),
        }
        for name, p in config.providers.items()
    ]
    if args.json:
        sys.stdout.write(orjson.dumps(rows, option=orjson.OPT_INDENT_2).decode() + "\n")
        return 0
    print(f"config: {config.source}")
    table = [["NAME", "KIND", "MODEL", "KEY", "PANEL", "TOOLS"]]
    for row in rows:
        table.append(
            [
                str(row["name"]),
                str(row["kind"]),
                str(row["model"]),
                _key_cell(row),
                "yes" if row["in_panel"] else "no",
                str(row["tool_mode"]),
            ]
        )
    _print_table(table)
    print(f"panel (confer): {', '.join(config.panel)}")
    print(_roles_line(config))
    # Breakers live in a serving process's memory; this one cannot see them.
    print("breaker states: ask a running server (its list_providers tool)")
    return 0


def _roles_line(config: Config) -> str:
    roles = config.roles
    line = (
        f"roles (coordinate): proposer {roles.proposer} · critics {', '.join(roles.critics) or 'none'} · "
        f"synthesizer {roles.synthesizer} (fallbacks: {', '.join(roles.synthesizer_fallbacks) or 'none'})"
    )
    if roles.synthesizer == roles.proposer:
        line += "\nnote: the proposer also synthesizes, judging its own proposal; set roles.synthesizer"
    return line


def _key_cell(row: dict[str, Any]) -> str:
    if row["api_key_env"] is None:
        return "not needed"
    return "yes" if row["key_present"] else f"no (set {row['api_key_env']})"


def cmd_doctor(args: argparse.Namespace) -> int:
    config = _load(args)
    checks, state_ok, state_line = anyio.run(_doctor, config, args.simulated, args.timeout)
    if args.json:
        payload = [_check_dict(c) for c in checks]
        sys.stdout.write(orjson.dumps(payload, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        _print_doctor(config, checks, args.simulated, state_line)
    if not state_ok:
        print(f"conclave doctor: state: {state_line}", file=sys.stderr)
    return 1 if any(c.broken for c in checks) or not state_ok else 0


async def _doctor(config: Config, simulated: bool, seconds: float) -> tuple[list[ProviderCheck], bool, str]:
    """The providers' checks, and whether the state backend works, with a line about it."""
    from conclave.app.doctor import check_providers
    from conclave.app.runtime import open_runtime

    async with _maybe_simulated(config, simulated) as effective, open_runtime(effective) as rt:
        state_ok, state_line = await rt.state.health()
        return await check_providers(rt, timeout_seconds=seconds), state_ok, state_line


@contextlib.asynccontextmanager
async def _maybe_simulated(config: Config, simulated: bool) -> AsyncIterator[Config]:
    if not simulated:
        yield config
        return
    from conclave.app.sim import SimPanel
    from conclave.app.sim.simulated import simulated_config

    async with SimPanel() as panel:
        yield simulated_config(config, panel.base_urls())


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


def _tracing_line(config: Config) -> str:
    """What `telemetry.otel` does: off, or where its spans go (the config was loaded, so the
    extra is there when it is on)."""
    if not config.telemetry.otel:
        return "off (telemetry.otel: false)"
    endpoint = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT", "http://localhost:4318 (the OTLP/HTTP default)"
    )
    service = os.environ.get("OTEL_SERVICE_NAME", "unknown_service (set OTEL_SERVICE_NAME)")
    return f"OpenTelemetry spans over OTLP/HTTP to {endpoint}, service {service}"


def _print_doctor(config: Config, checks: list[ProviderCheck], simulated: bool, state_line: str) -> None:
    label = " [SIMULATED PANEL: no real provider is called]" if simulated else ""
    print(f"config: {config.source} (valid){label}")
    print(f"tracing: {_tracing_line(config)}")
    print(f"state: {state_line}")
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
    if broken and all(c.verdict == "missing_key" for c in checks if c.in_use):
        print(
            "no provider in use has its key: put the keys in the environment or ./.env, or see "
            "Conclave work without one: `conclave doctor --simulated`, `conclave demo`"
        )


def cmd_fetch(args: argparse.Namespace) -> int:
    if "://" not in args.url:  # not a URL at all: a usage error, not a policy's refusal
        print(
            f"conclave fetch: {args.url!r} is not a URL; write it whole, e.g. https://example.org/",
            file=sys.stderr,
        )
        return EXIT_USAGE
    tool_args: dict[str, Any] = {"url": args.url}
    if args.max_bytes is not None:
        tool_args["max_bytes"] = args.max_bytes
    if args.session:
        tool_args["session_id"] = args.session
    return _run_tool(args, "fetch", tool_args, failed=lambda _result: False)


def cmd_verify(args: argparse.Namespace) -> int:
    try:
        source = sys.stdin.read() if args.checks == "-" else Path(args.checks).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        print(f"conclave verify: cannot read {args.checks}: {reason}", file=sys.stderr)
        return 2
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
    if (status := _refuse_invalid(name, tool_args)) is not None:
        return status
    try:
        result = anyio.run(_run_in_runtime, config, name, tool_args, None)
    except ToolError as exc:
        print(f"conclave {name}: {exc.message}", file=sys.stderr)
        return 1
    if args.json:
        sys.stdout.write(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        print(tool_spec(name).render(result))
    return 1 if failed(result) else 0


def _refuse_invalid(name: str, tool_args: dict[str, Any]) -> int | None:
    """The command line's door: arguments are checked here, before any runtime or progress
    display exists; exit status 2 when they are invalid."""
    try:
        tool_spec(name).validate(tool_args)
    except InvalidArguments as exc:
        message = " ".join(exc.message.split())
        print(f"conclave {name}: invalid arguments at {exc.path}: {message}", file=sys.stderr)
        return 2
    return None


async def _run_in_runtime(
    config: Config, name: str, tool_args: dict[str, Any], progress: LiveProgress | None
) -> dict[str, Any]:
    from conclave.app.runner import run_tool
    from conclave.app.runtime import open_runtime

    async with open_runtime(config) as runtime:
        return await run_tool(runtime, name, tool_args, progress)


def cmd_sim(args: argparse.Namespace) -> int:
    from conclave.app.sim.__main__ import main as sim_main

    argv = ["--host", args.host, "--port", str(args.port), "--latency-ms", str(args.latency_ms)]
    argv += ["--caching"] if args.caching else []
    argv += ["--stream-tokens-per-s", str(args.stream_tokens_per_s)] if args.stream_tokens_per_s else []
    argv += ["--no-role-answers"] if args.no_role_answers else []
    status: int = sim_main(argv)
    return status


# ---------------------------------------------------------------- confer and coordinate


class _InputError(Exception):
    """A question or context that cannot be read: one line, exit status 2."""


def _read_text(source: str, what: str) -> str:
    """The text of a file, or of standard input for `-`."""
    try:
        if source == "-":
            return sys.stdin.read()
        return Path(source).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else "not UTF-8 text"
        where = "standard input" if source == "-" else repr(source)
        raise _InputError(f"cannot read the {what} from {where}: {reason}") from None


def _inputs(args: argparse.Namespace, first: str) -> dict[str, Any]:
    """The question (or task) and the context, each given inline, from a file, or from stdin."""
    text: str = getattr(args, first)
    if text == "-" and args.context_file == "-":
        raise _InputError(f"the {first} and --context-file cannot both read standard input")
    out: dict[str, Any] = {first: _read_text("-", first) if text == "-" else text}
    if args.context_file is not None:
        out["context"] = _read_text(args.context_file, "context")
    return out


def cmd_confer(args: argparse.Namespace) -> int:
    return _deliberation(args, "confer")


def cmd_coordinate(args: argparse.Namespace) -> int:
    return _deliberation(args, "coordinate")


def deliberation_arguments(tool: Deliberation, args: argparse.Namespace) -> dict[str, Any]:
    """The tool arguments a `confer` or `coordinate` command line gives: only what the user
    gave, so absent options fall back to the config inside the tool. Reads standard input for
    `-`; raises _InputError when a question or context cannot be read."""
    own = _confer_args(args) if tool == "confer" else _coordinate_args(args)
    return {**_inputs(args, "question" if tool == "confer" else "task"), **own, **_call_args(args)}


def _confer_args(args: argparse.Namespace) -> dict[str, Any]:
    tool_args: dict[str, Any] = {}
    if args.providers is not None:
        tool_args["providers"] = _names(args.providers)
    if args.system is not None:
        tool_args["system"] = args.system
    for stage in ("review", "synthesize"):
        if getattr(args, stage):
            tool_args[stage] = True
    schema = _answer_schema(args)
    if schema is not None:
        tool_args["answer_schema"] = schema
    if args.vote_fields is not None:
        tool_args["vote_fields"] = _names(args.vote_fields)
    if args.tolerance is not None:
        tool_args["tolerance"] = args.tolerance
    for option, name in (("quorum", "quorum"), ("grace", "grace_seconds"), ("on_partial", "on_partial")):
        if getattr(args, option) is not None:
            tool_args[name] = getattr(args, option)
    return tool_args


def _answer_schema(args: argparse.Namespace) -> dict[str, Any] | None:
    """`--choices`, `--number` or `--answer-schema` (a file, or the JSON itself) as a schema;
    _InputError when it cannot be read. Whether the schema is acceptable is the tool's to say."""
    from conclave.schema.answer_schema import choices_schema, number_schema

    if args.choices is not None:
        try:
            return choices_schema(_names(args.choices))
        except ValueError as exc:
            raise _InputError(f"--choices: {exc}") from None
    if args.number:
        return number_schema()
    if args.answer_schema is None:
        return None
    given = args.answer_schema
    text = given if given.lstrip().startswith("{") else _read_schema_file(given)
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise _InputError(f"--answer-schema: not JSON ({exc})") from None
    if not isinstance(value, dict):
        raise _InputError("--answer-schema: a JSON Schema object is expected")
    return value


def _read_schema_file(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise _InputError(f"--answer-schema: cannot read {path}: {exc}") from None


def _coordinate_args(args: argparse.Namespace) -> dict[str, Any]:
    tool_args: dict[str, Any] = {}
    for key in ("proposer", "synthesizer", "rounds"):
        if getattr(args, key) is not None:
            tool_args[key] = getattr(args, key)
    if args.critics is not None:
        tool_args["critics"] = _names(args.critics)
    if args.all_rounds:
        tool_args["stop_when_converged"] = False
    schema = _answer_schema(args)
    if schema is not None:
        tool_args["answer_schema"] = schema
    for option, name in (("quorum", "quorum"), ("grace", "grace_seconds")):
        if getattr(args, option) is not None:
            tool_args[name] = getattr(args, option)
    return tool_args


# CLI option -> tool argument, for the options both commands share.
_CALL_OPTIONS = {
    "context": "context",
    "cost_cap": "worker_tool_cost_cap_usd",
    "cost_cap_mode": "worker_tool_cost_cap_mode",
    "worker_tool_mode": "worker_tool_mode",
    "timeout": "timeout_seconds",
    "max_tokens": "max_tokens",
    "temperature": "temperature",
    "session": "session_id",
    "follow_up": "follow_up_of",
}


def _call_args(args: argparse.Namespace) -> dict[str, Any]:
    """Only what the user gave: absent options fall back to the config inside the tool."""
    out = {
        name: getattr(args, option)
        for option, name in _CALL_OPTIONS.items()
        if getattr(args, option) is not None
    }
    if args.worker_tools is not None:
        out["worker_tools"] = _names(args.worker_tools)
    if args.dry_run:
        out["dry_run"] = True
    return out


def _names(value: str) -> list[str]:
    return [name.strip() for name in value.split(",") if name.strip()]


def _deliberation(args: argparse.Namespace, tool: Deliberation) -> int:
    """Exit 0 when complete, 1 when degraded (or short of its members with --on-partial error),
    3 when no model answered at all, 2 on invalid arguments (config errors: see main)."""
    from conclave.app.render import nobody_answered, progress_for, render, wants_colour

    config = _load(args)
    try:
        tool_args = deliberation_arguments(tool, args)
    except _InputError as exc:
        print(f"conclave {tool}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if (status := _refuse_invalid(tool, tool_args)) is not None:
        return status
    if (unknown := _unknown_providers(tool_args, config)) is not None:
        print(f"conclave {tool}: {unknown}", file=sys.stderr)
        return EXIT_USAGE
    progress = progress_for(tool, tool_args, config, sys.stderr)
    try:
        result = anyio.run(_run_in_runtime, config, tool, tool_args, progress)
    except PartialResult as exc:  # on_partial error: the call came back short of its members
        print(f"conclave {tool}: {exc.message}", file=sys.stderr)
        return EXIT_DEGRADED
    except InvalidArguments as exc:  # what the tool itself checks (a quorum over the members asked)
        print(f"conclave {tool}: invalid arguments at {exc.path}: {exc.message}", file=sys.stderr)
        return EXIT_USAGE
    if args.json:
        sys.stdout.write(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        print(render(tool, result, colour=wants_colour(sys.stdout)))
    if nobody_answered(result):
        return EXIT_NO_ANSWER
    return EXIT_DEGRADED if result.get("degraded") else EXIT_OK


def _unknown_providers(tool_args: dict[str, Any], config: Config) -> str | None:
    """A provider name the config does not define is a typo on the command line: say so and
    list the names that work, rather than run a call that can only come back degraded."""
    named = [*tool_args.get("providers", ()), *tool_args.get("critics", ())]
    named += [tool_args[key] for key in ("proposer", "synthesizer") if key in tool_args]
    unknown = [name for name in dict.fromkeys(named) if name not in config.providers]
    if not unknown:
        return None
    which = ", ".join(repr(name) for name in unknown)
    noun = "provider" if len(unknown) == 1 else "providers"
    return (
        f"unknown {noun} {which}; configured: {', '.join(config.providers)} (conclave providers lists them)"
    )


# ---------------------------------------------------------------- tail, serve, demo


def cmd_tail(args: argparse.Namespace) -> int:
    from conclave.app.render import wants_colour
    from conclave.app.tail import Filters, TailOptions, run_tail

    config = _load(args)
    options = TailOptions(
        filters=Filters.parse(args.session, args.event, args.provider),
        json=args.json,
        lines=args.lines,
        follow=args.follow,
        colour=wants_colour(sys.stdout),
    )
    return run_tail(Path(config.telemetry.path), options, sys.stdout, sys.stderr)


def cmd_serve(args: argparse.Namespace) -> int:
    """stdout is the JSON-RPC wire: this command itself only ever writes to stderr."""
    from conclave.app import server

    config = _load(args)
    if args.http is None:
        if args.workers > 1:
            print("conclave serve: --workers needs --http HOST:PORT (stdio has one client)", file=sys.stderr)
            return 2
        _serve_until_interrupted(server.serve_stdio, config)
        return 0
    try:
        host, port = parse_bind(args.http)
    except ValueError as exc:
        print(f"conclave serve: --http {args.http!r}: {exc}", file=sys.stderr)
        return 2
    if not is_loopback(host):
        print(
            f"conclave serve: WARNING: --http binds to {host}, which is reachable from other machines; "
            "anyone who can connect can spend your provider keys. Prefer 127.0.0.1.",
            file=sys.stderr,
        )
    if args.workers > 1:
        if config.state.backend == "memory":
            print(
                f"conclave serve: note: the {args.workers} workers share no state (state.backend: memory): "
                "each has its own breakers, concurrency limit, egress budgets and tasks, and a task is "
                "known only to the worker that started it. Set state.backend: redis to share them "
                "(docs/deploying.md).",
                file=sys.stderr,
            )
        return _serve_workers(args, host, port)
    _serve_until_interrupted(server.serve_http, config, host, port, args.worker_of)
    return 0


def _serve_workers(args: argparse.Namespace, host: str, port: int) -> int:
    from conclave.app.server.workers import Supervisor, reuse_port_available

    if not reuse_port_available():
        print(
            "conclave serve: --workers needs SO_REUSEPORT, which this platform lacks; run one "
            "`conclave serve --http` per port behind a load balancer instead",
            file=sys.stderr,
        )
        return 2
    passed = [*(["--config", args.config] if args.config else []), *(f"--set={o}" for o in args.overrides)]
    try:
        supervisor = Supervisor(host, port, args.workers, passed)
    except OSError as exc:
        print(f"conclave serve: --http {args.http!r}: cannot bind: {exc.strerror or exc}", file=sys.stderr)
        return 2
    return supervisor.run()


def cmd_ui(args: argparse.Namespace) -> int:
    from conclave.app.ui import run_ui

    config = _load(args)
    try:
        host, port = parse_bind(args.http, default_port=DEFAULT_UI_PORT)
    except ValueError as exc:
        print(f"conclave ui: --http {args.http!r}: {exc}", file=sys.stderr)
        return 2
    if not is_loopback(host):
        if not args.allow_remote:
            print(
                f"conclave ui: refusing to serve on {host}, which other machines can reach: the page shows "
                "every question, answer and fetched page in the transcripts. Use 127.0.0.1, or pass "
                "--allow-remote if you mean it.",
                file=sys.stderr,
            )
            return 2
        print(f"conclave ui: WARNING: serving on {host}, reachable from other machines.", file=sys.stderr)
    _serve_until_interrupted(run_ui, config, host, port)
    return 0


def _serve_until_interrupted(function: Callable[..., Awaitable[None]], *args: Any) -> None:
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C is how a server is stopped
        anyio.run(function, *args)


def parse_bind(value: str, *, default_port: int = DEFAULT_HTTP_PORT) -> tuple[str, int]:
    """`HOST:PORT`, `[v6]:PORT`, `HOST` or `:PORT` into (host, port); loopback and 8765 by default."""
    host, port = value, str(default_port)
    if value.startswith("["):
        host, sep, rest = value[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise ValueError("write an IPv6 address as [ADDRESS]:PORT")
        port = rest[1:] or port
    elif value.count(":") == 1:
        host, port = value.split(":")
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"port must be a number from 0 to 65535, got {port!r}")
    return host or "127.0.0.1", int(port)


def cmd_demo(args: argparse.Namespace) -> int:
    from conclave.app.demo import main as demo_main

    if args.local:
        return _demo_local(args)
    config = _load(args)
    return demo_main(
        config, latency_ms=args.latency_ms, out=sys.stdout, err=sys.stderr, ui_command=_ui_command(args)
    )


def cmd_eval(args: argparse.Namespace) -> int:
    from conclave.app.evals import command, demo

    if (args.suite is None) == (not args.demo):
        print("conclave eval: give a SUITE (e.g. builtin:basic), or --demo", file=sys.stderr)
        return EXIT_USAGE
    if args.max_cost is not None and not (math.isfinite(args.max_cost) and args.max_cost > 0):
        print(
            f"conclave eval: --max-cost must be a number of USD above 0, not {args.max_cost}", file=sys.stderr
        )
        return EXIT_USAGE
    options = command.Options(
        suite=args.suite or demo.SUITE,
        strategies=args.strategies,
        budget=args.budget,
        limit=args.limit,
        concurrency=args.concurrency,
        max_cost=args.max_cost,
        out=args.out,
        resume=args.resume,
        seed=args.seed,
        judges=args.judges,
        json=args.json,
    )
    run = demo.main if args.demo else command.main
    return run(_load(args), options, out=sys.stdout, err=sys.stderr)


def _demo_local(args: argparse.Namespace) -> int:
    from conclave.app.demo import main_local

    return main_local(_load(args), out=sys.stdout, err=sys.stderr, ui_command=_ui_command(args))


def _ui_command(args: argparse.Namespace) -> str:
    """`conclave ui` with the options that load the configuration `args` loaded, typed as this
    machine runs this conclave (`.venv/bin/conclave` when none is on the PATH)."""
    from conclave.app.command import conclave_command

    words = [*shlex.split(conclave_command()), "ui"]
    if args.config:
        words += ["--config", args.config]
    for override in args.overrides:
        words += ["--set", override]
    return shlex.join(words)


def _print_table(rows: list[list[str]]) -> None:
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        cells = [str(cell).ljust(width) for cell, width in zip(row, widths, strict=True)]
        print("  ".join(cells).rstrip())


__all__ = ["build_parser", "main"]
