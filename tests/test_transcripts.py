"""Transcripts are written whole or not at all."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from conclave.deliberation.transcripts import atomic_write, write_transcript
from conclave.redact import Redactor


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


def test_transcripts_are_redacted_of_secrets(tmp_path: Path) -> None:
    secret = "sk-transcript-secret-123456789"
    path = write_transcript(
        tmp_path, "s-1", "confer", {"arguments": {"question": f"my key is {secret}"}}, Redactor([secret])
    )
    assert path.name.startswith("s-1-confer-")
    assert secret not in path.read_text()
    assert "[REDACTED]" in path.read_text()
