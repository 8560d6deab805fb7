"""A real browser for the page's tests and screenshots: Debian's Chromium, headless, driven by
Playwright (never `playwright install`: the browser is the system's), and `conclave ui` run as the
user runs it, a subprocess on a loopback port."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from playwright.sync_api import Browser

# Without the background-networking flags Chromium keeps trying to reach Google's services, which
# this sandbox refuses; none of it is needed to render a local page.
CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def chromium_path() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def why_no_browser() -> str | None:
    """Why the browser tests cannot run here, loud enough to be noticed in a summary; None when
    they can."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "BROWSER TESTS SKIPPED: the playwright package is missing (scripts/setup dev installs it)"
    if chromium_path() is None:
        return "BROWSER TESTS SKIPPED: no chromium on this machine (apt-get install chromium; scripts/setup dev does it as root)"
    return None


@contextlib.contextmanager
def chromium() -> Iterator[Browser]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        # launch() gives the browser a fresh temporary profile of its own, removed at close.
        browser = playwright.chromium.launch(
            executable_path=chromium_path(), args=CHROMIUM_ARGS, headless=True
        )
        try:
            yield browser
        finally:
            browser.close()


@contextlib.contextmanager
def conclave_ui(workdir: Path) -> Iterator[str]:
    """`conclave ui` on a free loopback port, reading the event log and transcripts under
    `workdir`; yields its address (`http://127.0.0.1:PORT`)."""
    settings = [
        "--set",
        f"telemetry.path={workdir}/events.ndjson",
        "--set",
        f"transcripts.dir={workdir}/transcripts",
    ]
    command = [sys.executable, "-m", "conclave", "ui", "--http", "127.0.0.1:0", *settings]
    env = {k: v for k, v in os.environ.items() if k != "CONCLAVE_CONFIG"}
    server = subprocess.Popen(command, cwd=workdir, env=env, stderr=subprocess.PIPE, text=True)
    try:
        assert server.stderr is not None
        line = server.stderr.readline()
        found = re.search(r"http://127\.0\.0\.1:\d+", line)
        assert found, (
            f"conclave ui did not start: {line}{server.stderr.read() if server.poll() is not None else ''}"
        )
        yield found[0]
    finally:
        server.terminate()
        server.wait(timeout=10)
