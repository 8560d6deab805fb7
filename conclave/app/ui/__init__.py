"""`conclave ui`: a local, read-only page to look at deliberations (docs/ui.md).

`sessions` finds sessions in the event log and the transcripts, `model` turns one into records,
`pages` renders them as HTML (through `markup`, where text can only be text); `evals` finds the
runs of `conclave eval` under `evals.dir` and `evalpages` renders them; `app` serves them all
with a guard and a strict Content-Security-Policy, and follows running sessions by server-sent
events read from the event log. `static/` holds the page's one small script and its style sheet:
nothing to build, nothing fetched from elsewhere, so the page works offline.
"""

from __future__ import annotations

from conclave.app.ui.app import build_app, mount, run_ui

__all__ = ["build_app", "mount", "run_ui"]
