"""Transcripts: each confer/coordinate call saved whole, written atomically (temp file in the
same directory, fsync, rename), so a crash mid-write never leaves a partial file behind."""

from __future__ import annotations

import contextlib
import functools
import os
import tempfile
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio.to_thread
import orjson

from conclave.redact import Redactor


def write_transcript(
    directory: str | Path,
    session_id: str,
    tool: str,
    payload: Mapping[str, Any],
    redactor: Redactor,
    *,
    fsync: bool = False,
) -> Path:
    """Write `<dir>/<YYYY-MM-DD>/<session>-<tool>-<time>.json`; returns the path."""
    now = datetime.now(UTC)
    folder = Path(directory) / now.strftime("%Y-%m-%d")
    path = folder / f"{session_id}-{tool}-{now.strftime('%H%M%S%f')}.json"
    body = redactor.json_bytes(orjson.dumps(payload, option=orjson.OPT_INDENT_2, default=str))
    atomic_write(path, _chunks(body), fsync=fsync)
    return path


async def save_transcript(
    directory: str | Path,
    session_id: str,
    tool: str,
    payload: Mapping[str, Any],
    redactor: Redactor,
    *,
    fsync: bool = False,
) -> Path:
    """`write_transcript` in a worker thread: disk writes and fsync never stall the event loop."""
    return await anyio.to_thread.run_sync(
        functools.partial(write_transcript, directory, session_id, tool, payload, redactor, fsync=fsync)
    )


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
