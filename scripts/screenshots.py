"""The README's two pictures of the page: the list of sessions, and the demo's confer (its answers
side by side, one hop opened, the review and the synthesis). Run through scripts/screenshots."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import anyio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from conclave.app.demo import run_demo  # noqa: E402
from tests.browser import chromium, conclave_ui, why_no_browser  # noqa: E402
from tests.ui_support import workdir_config  # noqa: E402

WIDTH = 1280


def main() -> int:
    if (why := why_no_browser()) is not None:
        print(why.replace("BROWSER TESTS SKIPPED", "no screenshots"), file=sys.stderr)
        return 1
    docs = ROOT / "docs"
    with tempfile.TemporaryDirectory(prefix="conclave-screens-") as folder:
        workdir = Path(folder)
        base = workdir_config(workdir)
        run = anyio.run(lambda: run_demo(base, latency_ms=50, progress=None))
        confer_id, _ = run.sessions
        with conclave_ui(workdir) as address, chromium() as browser:
            page = browser.new_page(viewport={"width": WIDTH, "height": 560}, device_scale_factor=1)
            page.goto(f"{address}/")
            page.screenshot(path=docs / "ui-sessions.png", full_page=True)
            page.set_viewport_size({"width": WIDTH, "height": 900})
            page.goto(f"{address}/session?id={confer_id}")
            page.locator(".card", has_text="sim-gemini").locator("summary").first.click()
            page.screenshot(path=docs / "ui-session.png", full_page=True)
    for name in ("ui-sessions.png", "ui-session.png"):
        print(f"wrote docs/{name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
