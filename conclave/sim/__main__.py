"""`python -m conclave.sim`: run the simulated panel until Ctrl-C or SIGTERM.

Once listening it prints one `<kind> <base_url>` line per wire format to stdout (and
nothing else there), so a parent process such as the benchmark can read the URLs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from collections.abc import Sequence

from conclave.sim.server import BASE_PATHS, SimPanel


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m conclave.sim",
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
    )
    async with panel:
        for kind in BASE_PATHS:
            print(f"{kind} {panel.base_url(kind)}", flush=True)
        print("conclave-sim: simulated panel listening; Ctrl-C to stop", file=sys.stderr)
        await stop.wait()


def main(argv: Sequence[str] | None = None) -> int:
    """Serve until stopped; the exit status is 0 after a clean Ctrl-C or SIGTERM."""
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(parse_args(argv)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
