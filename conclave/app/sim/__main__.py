"""`python -m conclave.app.sim`: run the simulated panel until Ctrl-C or SIGTERM.

Once listening it prints one `<kind> <base_url>` line per wire format to stdout (and
nothing else there), so a parent process such as the benchmark can read the URLs; on stderr,
a `conclave` command with the `--set` options that point it at the panel.

Models nobody scripted answer role prompts (proposer, critic, reviewer, synthesizer) with valid
envelopes (`roles.py`), so `confer --review --synthesize` and `coordinate` work against it;
`--no-role-answers` gives them the plain default answer instead.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shlex
import signal
import sys
from collections.abc import Sequence

from conclave.app.sim.server import SimPanel
from conclave.app.sim.simulated import set_options

EXAMPLE = ["confer", "Which option?", "--review", "--synthesize"]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m conclave.app.sim",
        description="Run Conclave's simulated panel (fake OpenAI, Anthropic and Gemini APIs).",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8900, help="0 picks a free port")
    parser.add_argument("--latency-ms", type=float, default=0.0)
    parser.add_argument(
        "--no-record",
        action="store_true",
        help="do not keep received requests (long benchmark runs)",
    )
    parser.add_argument(
        "--caching", action="store_true", help="play each provider's prompt caching rule in usage"
    )
    parser.add_argument(
        "--stream-tokens-per-s",
        type=float,
        default=None,
        metavar="N",
        help="write streamed answers at N simulated tokens (frames) a second (default: at once)",
    )
    parser.add_argument(
        "--no-role-answers",
        action="store_true",
        help="answer role prompts in plain text too (then review, synthesis and coordinate fail)",
    )
    return parser.parse_args(argv)


async def serve(args: argparse.Namespace) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):  # no signal handlers on Windows
            loop.add_signal_handler(sig, stop.set)
    panel = SimPanel(
        host=args.host,
        port=args.port,
        latency_ms=args.latency_ms,
        record=not args.no_record,
        caching=args.caching,
        role_answers=not args.no_role_answers,
        stream_tokens_per_s=args.stream_tokens_per_s,
    )
    async with panel:
        urls = panel.base_urls()
        for kind, url in urls.items():
            print(f"{kind} {url}", flush=True)
        print("conclave-sim: simulated panel listening; Ctrl-C to stop", file=sys.stderr)
        print(recipe(urls), file=sys.stderr, flush=True)
        await stop.wait()


def recipe(urls: dict[str, str]) -> str:
    """How to point conclave at the panel: an example command carrying the `--set` options (which
    any command takes), to run as printed."""
    from conclave.app.command import conclave_command  # imported once the URLs are out: no parent waits on it

    command = shlex.join([*EXAMPLE, *set_options(urls)])
    return (
        "conclave-sim: to ask it, add these --set options to any conclave command (or use the config "
        f"file in docs/development.md), e.g.:\n  {conclave_command()} {command}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Serve until stopped; the exit status is 0 after a clean Ctrl-C or SIGTERM."""
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(parse_args(argv)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
