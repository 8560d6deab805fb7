"""What the code's own text promises about the command line is true of the parser."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import conclave
from conclave.app.cli import build_parser

SOURCE = Path(conclave.__file__).parent


def every_option(parser: argparse.ArgumentParser) -> set[str]:
    found = {flag for action in parser._actions for flag in action.option_strings}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found |= every_option(sub)
    return found


def test_every_option_a_docstring_names_exists() -> None:
    named = {
        (match.group(1), path.relative_to(SOURCE).as_posix())
        for path in SOURCE.rglob("*.py")
        for match in re.finditer(r"`(--[a-z][a-z-]*)", path.read_text(encoding="utf-8"))
    }
    options = every_option(build_parser())
    assert sorted((option, where) for option, where in named if option not in options) == []
