"""Transcripts are written whole or not at all."""

from __future__ import annotations

import errno
import json
import os
import stat
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from conclave.deliberation import transcripts
from conclave.deliberation.transcripts import TranscriptWriter, atomic_write, write_new_atomically
from conclave.obs.redact import Redactor


def test_a_crash_mid_write_leaves_no_partial_file_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "t" / "session.json"

    def chunks() -> Iterator[bytes]:
        yield b'{"half": '
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic_write(target, chunks())
    assert not target.exists()
    assert list(target.parent.iterdir()) == []


def test_a_crash_mid_rewrite_keeps_the_previous_version_whole(tmp_path: Path) -> None:
    target = tmp_path / "session.json"
    atomic_write(target, [b'{"version": 1}'])

    def chunks() -> Iterator[bytes]:
        yield b'{"version": '
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        atomic_write(target, chunks())
    assert target.read_bytes() == b'{"version": 1}'


@pytest.mark.parametrize("fsync", [False, True], ids=["written-at-submit", "background-thread"])
def test_transcripts_are_redacted_of_secrets_and_whole_once_the_writer_closes(
    tmp_path: Path, fsync: bool
) -> None:
    secret = "sk-transcript-secret-123456789"
    writer = TranscriptWriter(tmp_path, Redactor([secret]), fsync=fsync)
    before = datetime.now(UTC)
    paths = [
        Path(writer.submit("s-1", "confer", {"arguments": {"question": f"my key is {secret}", "n": n}}))
        for n in range(3)
    ]
    after = datetime.now(UTC)
    for n, path in enumerate(paths):  # <dir>/<UTC day>/<session>-<tool>-<HHMMSSffffff>-<n>.json
        day, name = path.parent.name, path.name
        time_of_day = name.split("-")[3]
        assert path.parent.parent == tmp_path and len(time_of_day) == 12 and time_of_day.isdigit()
        written = datetime.strptime(f"{day} {time_of_day}", "%Y-%m-%d %H%M%S%f").replace(tzinfo=UTC)
        assert before <= written <= after, (before, name, after)
        assert name.endswith(f"-{n:04d}.json")
    if not fsync:
        assert all(p.exists() for p in paths), "without fsync the call writes its transcript itself"
    writer.close()
    assert len(set(paths)) == 3, "two calls of one session never share a file"
    for n, path in enumerate(paths):
        assert path.name.startswith("s-1-confer-")
        body = json.loads(path.read_text())
        assert body["arguments"] == {"question": "my key is [REDACTED]", "n": n}
    assert secret not in "".join(p.read_text() for p in paths)


@pytest.mark.parametrize("fsync", [False, True], ids=["written-at-submit", "background-thread"])
def test_the_payload_is_captured_when_submitted_not_when_written(tmp_path: Path, fsync: bool) -> None:
    writer = TranscriptWriter(tmp_path, Redactor(), fsync=fsync)
    result = {"status": "ok"}
    path = Path(writer.submit("s-2", "confer", {"result": result}))
    result["status"] = "changed later by the caller"
    writer.close()
    assert json.loads(path.read_text()) == {"result": {"status": "ok"}}


def test_a_transcript_that_cannot_be_written_is_counted_and_the_call_goes_on(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the transcripts directory should be")
    writer = TranscriptWriter(blocker, Redactor())
    writer.submit("s-3", "confer", {"result": {}})
    writer.close()
    assert writer.failures == 1
    assert blocker.read_text().startswith("a file")


unnamed_files = pytest.mark.skipif(
    not transcripts._UNNAMED_FILES, reason="no O_TMPFILE or /proc/self/fd on this system"
)


def refuse(*_args: Any, **_kwargs: Any) -> None:
    raise AssertionError("the temporary-file path was taken")


@unnamed_files
def test_on_linux_a_new_transcript_is_an_unnamed_file_linked_into_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(transcripts, "atomic_write", refuse)
    target = tmp_path / "2026-11-23" / "s-1-confer.json"

    write_new_atomically(target, b'{"whole": true}', fsync=False)

    assert target.read_bytes() == b'{"whole": true}'
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert [p.name for p in target.parent.iterdir()] == ["s-1-confer.json"]


@unnamed_files
def test_a_failure_while_naming_the_file_leaves_nothing_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken_link(*_args: Any, **_kwargs: Any) -> None:
        raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr(transcripts.os, "link", broken_link)
    target = tmp_path / "s-2-confer.json"

    with pytest.raises(OSError, match="I/O error"):
        write_new_atomically(target, b'{"whole": true}', fsync=True)
    assert list(tmp_path.iterdir()) == []


def test_an_existing_name_is_replaced_whole(tmp_path: Path) -> None:
    target = tmp_path / "s-3-confer.json"
    target.write_bytes(b'{"version": 1}')

    write_new_atomically(target, b'{"version": 2}', fsync=False)

    assert target.read_bytes() == b'{"version": 2}'
    assert [p.name for p in tmp_path.iterdir()] == ["s-3-confer.json"]


def test_a_filesystem_without_unnamed_files_gets_a_renamed_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_open = os.open

    def no_tmpfile(path: Any, flags: int, *args: Any) -> int:
        if flags & getattr(os, "O_TMPFILE", 0) == getattr(os, "O_TMPFILE", -1):
            raise OSError(errno.EOPNOTSUPP, "Operation not supported")
        return real_open(path, flags, *args)

    monkeypatch.setattr(transcripts.os, "open", no_tmpfile)
    target = tmp_path / "day" / "s-4-confer.json"

    write_new_atomically(target, b'{"whole": true}', fsync=False)

    assert target.read_bytes() == b'{"whole": true}'
    assert [p.name for p in target.parent.iterdir()] == ["s-4-confer.json"]


@unnamed_files
def test_a_failure_that_is_not_about_unnamed_files_is_raised_without_a_second_attempt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the day's directory should be")
    monkeypatch.setattr(transcripts, "atomic_write", refuse)

    with pytest.raises(NotADirectoryError):
        write_new_atomically(blocker / "s-5-confer.json", b"{}", fsync=False)
    assert blocker.read_text().startswith("a file")
