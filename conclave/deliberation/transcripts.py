"""Transcripts: each confer/coordinate call saved whole, written atomically (temp file in the
same directory, optional fsync, rename), so a crash mid-write never leaves a partial file behind.

Calls hand their transcript to one background writer thread (`TranscriptWriter`) and return at
once: waiting for the disk on the result path cost more than the rest of a call's bookkeeping.
The payload is serialized and redacted before it is queued, so later changes to the result
cannot reach the file; closing the writer drains the queue.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import queue
import sys
import tempfile
import threading
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from conclave.redact import Redactor


class TranscriptWriter:
    def __init__(self, directory: str | Path, redactor: Redactor, *, fsync: bool = False) -> None:
        self._directory = Path(directory)
        self._redactor = redactor
        self._fsync = fsync
        self._queue: queue.SimpleQueue[tuple[Path, bytes] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._sequence = itertools.count()
        self.failures = 0

    def submit(self, session_id: str, tool: str, payload: Mapping[str, Any]) -> Path:
        """Queue `<dir>/<YYYY-MM-DD>/<session>-<tool>-<time>-<n>.json`; returns the path it will have."""
        now = datetime.now(UTC)
        name = f"{session_id}-{tool}-{now.strftime('%H%M%S%f')}-{next(self._sequence):04d}.json"
        path = self._directory / now.strftime("%Y-%m-%d") / name
        body = self._redactor.json_bytes(orjson.dumps(payload, option=orjson.OPT_INDENT_2, default=str))
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="conclave-transcripts", daemon=True)
            self._thread.start()
        self._queue.put((path, body))
        return path

    def close(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            path, body = item
            try:
                atomic_write(path, _chunks(body), fsync=self._fsync)
            except OSError as exc:  # a full disk must not kill the writer; say so where people look
                self.failures += 1
                print(f"conclave: transcript {path} not written: {exc}", file=sys.stderr)


def atomic_write(path: Path, chunks: Iterable[bytes], *, fsync: bool = True) -> None:
    """All of the file or none of it: a failure while writing removes the temporary file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as out:
            for chunk in chunks:
                out.write(chunk)
            out.flush()
            if fsync:
                os.fsync(out.fileno())
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
        raise


def _chunks(body: bytes, size: int = 1 << 16) -> Iterable[bytes]:
    for start in range(0, len(body), size):
        yield body[start : start + size]
