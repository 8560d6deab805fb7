"""`@record` (conclave/core/records.py): frozen to the type checker, plain slots at run time.

The run-time guard of `frozen=True` is traded for speed, so what stands in for it is checked
here: `mypy --strict`, as CI runs it, must reject an assignment to a record's field, and
records must still compare and hash by value, as frozen dataclasses do.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conclave.core.messages import Completion, Message, Usage

ROOT = Path(__file__).resolve().parents[1]

SNIPPET = """\
from conclave.core.messages import Usage
from conclave.worker.loop import WorkerTurn

def bump(usage: Usage, turn: WorkerTurn) -> None:
    usage.input_tokens = 1
    turn.deadline = 0.0
"""


def test_records_compare_and_hash_by_value() -> None:
    usage = Usage(3, 4, cached_input_tokens=1)
    assert usage == Usage(3, 4, cached_input_tokens=1) and usage != Usage(3, 5, cached_input_tokens=1)
    assert hash(usage) == hash(Usage(3, 4, cached_input_tokens=1))
    assert len({Message("user", "a"), Message("user", "a"), Message("assistant", "a")}) == 2
    done = Completion("hi", "stop", usage, "m", warnings=("w",))
    assert hash(done) == hash(Completion("hi", "stop", usage, "m", warnings=("w",)))
    assert not hasattr(done, "__dict__")  # slots: no per-instance dict


def test_the_type_checker_rejects_assigning_a_record_field(tmp_path: Path) -> None:
    module = tmp_path / "assigns_a_record_field.py"
    module.write_text(SNIPPET)
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", str(module)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert f'{module.name}:5: error: Property "input_tokens" defined in "Usage" is read-only' in done.stdout
    assert f'{module.name}:6: error: Property "deadline" defined in "WorkerTurn" is read-only' in done.stdout
