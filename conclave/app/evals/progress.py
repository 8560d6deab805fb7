"""The eval's progress bar on a terminal (tqdm), with what the run has spent so far; nothing when
the output is not a terminal, so logs and pipes get only the table."""

from __future__ import annotations

from collections.abc import Mapping
from types import TracebackType
from typing import IO, Any

from tqdm import tqdm


class Bar:
    """A `runner.Progress` drawn by tqdm on `stream` while the context is open."""

    def __init__(self, stream: IO[str], *, description: str) -> None:
        self._stream = stream
        self._description = description
        self._bar: tqdm[Any] | None = None
        self._spent = 0.0

    def __enter__(self) -> Bar:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._bar is not None:
            self._bar.close()

    def started(self, total: int) -> None:
        self._bar = tqdm(
            total=total,
            desc=self._description,
            unit="answer",
            file=self._stream,
            disable=not _is_terminal(self._stream),
            leave=False,
            dynamic_ncols=True,
        )

    def answered(self, line: Mapping[str, Any]) -> None:
        if self._bar is None:
            return
        self._spent += line.get("cost_usd") or 0.0
        self._bar.set_postfix_str(f"${self._spent:.4f}", refresh=False)
        self._bar.update(1)


def _is_terminal(stream: IO[str]) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())
