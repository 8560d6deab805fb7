"""What to type to run this same conclave again: the commands `conclave demo`, `conclave ui` and
`python -m conclave.app.sim` print."""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from collections.abc import Callable


def conclave_command(
    *,
    argv0: str | None = None,
    executable: str | None = None,
    cwd: str | None = None,
    which: Callable[[str], str | None] = shutil.which,
) -> str:
    """What to type to run this same conclave again, for the commands the demo prints: `conclave`
    when PATH finds this one, else its path, relative when under the current directory (after
    `scripts/demo`, which runs `.venv/bin/conclave` with no virtualenv activated, that is
    `.venv/bin/conclave`), else `<python> -m conclave`. The arguments default to this process's."""
    executable = executable or sys.executable
    running = _running_script(argv0 if argv0 is not None else sys.argv[0], executable)
    if running is None:
        return shlex.join([_shown(executable, cwd), "-m", "conclave"])
    found = which("conclave")
    if found is not None and _same_file(found, running):
        return "conclave"
    return shlex.quote(_shown(running, cwd))


def _running_script(argv0: str, executable: str) -> str | None:
    """The `conclave` script this process runs: argv[0] when it is one; under `python -m conclave`
    (argv[0] is the package's __main__.py), the script installed beside the interpreter, which
    runs the same installation; None when there is none."""
    for candidate in (argv0, *(os.path.join(os.path.dirname(executable), n) for n in _SCRIPT_NAMES)):
        if os.path.basename(candidate) in _SCRIPT_NAMES and os.path.isfile(candidate):
            return candidate
    return None


_SCRIPT_NAMES = ("conclave", "conclave.exe")


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _shown(path: str, cwd: str | None) -> str:
    """`path` relative to `cwd` when under it (`./x` rather than a bare name PATH would look up),
    else absolute. Not resolved: a virtualenv's python is a symlink that must keep its name."""
    absolute = os.path.abspath(path)
    here = os.path.abspath(cwd or os.getcwd())
    try:
        under = os.path.commonpath([absolute, here]) == here
    except ValueError:  # on another drive (Windows)
        under = False
    if not under:
        return absolute
    relative = os.path.relpath(absolute, here)
    return relative if os.sep in relative else os.path.join(".", relative)
