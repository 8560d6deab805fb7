"""Transcripts: each confer/coordinate call saved whole, written atomically (an unnamed file
linked into place on Linux, else a temporary file in the same directory renamed; optional
fsync), so a crash mid-write never leaves a partial file behind.

Without fsync a transcript is written where the call ends: the write only reaches the page
cache, and handing it to a thread slowed the event loop more than the write itself (see
docs/performance.md). With fsync on, a call would wait for the disk, so one background thread
writes instead and calls return at once.
Either way the payload is serialized and redacted at submit, so later changes to the result
cannot reach the file; closing the writer drains the queue.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import queue
import sys
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import orjson

from conclave.obs.redact import Redactor
from conclave.obs.telemetry import UtcStamp


class TranscriptWriter:
    def __init__(self, directory: str | Path, redactor: Redactor, *, fsync: bool = False) -> None:
        self._directory = os.fspath(directory)
        self._redactor = redactor
        self._fsync = fsync
        self._queue: queue.SimpleQueue[tuple[str, bytes] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._sequence = itertools.count()
        self._stamp = UtcStamp()
        self.failures = 0

    def submit(self, session_id: str, tool: str, payload: Mapping[str, Any]) -> str:
        """Write (or, with fsync, queue) `<dir>/<YYYY-MM-DD>/<session>-<tool>-<time>-<n>.json`;
        returns its path. The timestamp is formatted once per second and reused."""
        stamp = self._stamp()  # 2026-11-24T00:07:40.319781+00:00
        time_of_day = stamp[11:13] + stamp[14:16] + stamp[17:19] + stamp[20:26]
        name = f"{session_id}-{tool}-{time_of_day}-{next(self._sequence):04d}.json"
        path = f"{self._directory}{os.sep}{stamp[:10]}{os.sep}{name}"
        body = self._redactor.json_bytes(orjson.dumps(payload, option=orjson.OPT_INDENT_2, default=str))
        if not self._fsync:
            self._write(path, body)
            return path
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
            self._write(*item)

    def _write(self, path: str, body: bytes) -> None:
        try:
            write_new_atomically(path, body, fsync=self._fsync)
        except OSError as exc:  # a full disk must not kill the writer; say so where people look
            self.failures += 1
            print(f"conclave: transcript {path} not written: {exc}", file=sys.stderr)


def atomic_write(path: Path, chunks: Iterable[bytes], *, fsync: bool = True) -> None:
    """All of the file or none of it: a failure while writing removes the temporary file.

    Plain descriptor calls: `tempfile` and a buffered file object cost several times the
    system calls themselves. The temporary name is unique per process and thread, the only
    writers that could race for it.
    """
    temp = path.with_name(f".{path.name}.{os.getpid()}-{threading.get_ident()}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    fd = _open_in(path.parent, temp, flags)
    try:
        try:
            for chunk in chunks:
                _write_all(fd, chunk)
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
        raise


# Linux can write a file with no name (O_TMPFILE) and give it one when whole (linkat via
# /proc/self/fd): one directory change instead of two (create a temporary, rename it), and
# still all or nothing.
_UNNAMED_FILES = hasattr(os, "O_TMPFILE") and os.path.isdir("/proc/self/fd")
_UNNAMED_FILE_FLAGS = getattr(os, "O_TMPFILE", 0) | os.O_WRONLY | getattr(os, "O_CLOEXEC", 0)
# What opening an unnamed file says where the filesystem or an older kernel has none.
_NO_UNNAMED_FILES = frozenset({errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL})


def write_new_atomically(path: str | Path, data: bytes, *, fsync: bool = True) -> None:
    """Write a new file whole or not at all: an unnamed file linked into place where the
    system has them, else `atomic_write`. An existing file is replaced, through `atomic_write`."""
    if not (_UNNAMED_FILES and _link_unnamed(path, data, fsync=fsync)):
        atomic_write(Path(path), (data,), fsync=fsync)


def _link_unnamed(path: str | Path, data: bytes, *, fsync: bool) -> bool:
    """Write `data` to an unnamed file and link it as `path`; False, with nothing left behind,
    where the filesystem has no unnamed files or `path` already exists."""
    directory = os.path.dirname(path)
    try:
        fd = _open_in(directory, directory, _UNNAMED_FILE_FLAGS)
    except OSError as exc:
        if exc.errno not in _NO_UNNAMED_FILES:
            raise  # not a question of support (a file where the directory should be, a permission)
        return False
    try:
        _write_all(fd, data)
        if fsync:
            os.fsync(fd)
        # A directory fd beside an absolute path is ignored by the kernel; passing one only
        # makes CPython call linkat() with AT_SYMLINK_FOLLOW, which names the unnamed file.
        os.link(f"/proc/self/fd/{fd}", path, src_dir_fd=fd, follow_symlinks=True)
    except FileExistsError:
        return False
    finally:
        os.close(fd)  # an unnamed file never linked is freed here: nothing is left behind
    return True


def _open_in(directory: str | Path, target: str | Path, flags: int) -> int:
    """`os.open(target, flags)` in `directory`, made first if missing (a new day's first file)."""
    try:
        return os.open(target, flags, 0o600)
    except FileNotFoundError:
        os.makedirs(directory, exist_ok=True)
        return os.open(target, flags, 0o600)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
