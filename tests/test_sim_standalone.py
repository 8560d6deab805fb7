"""`conclave sim` on its own, as a user runs it: started the way the CLI starts it, then `conclave`
pointed at it through the command it prints and through docs/development.md's config file.
Review, synthesis and coordinate must run clean, with no invalid envelope anywhere."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

DOCS = Path(__file__).resolve().parent.parent / "docs" / "development.md"
ENV = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY") and k != "CONCLAVE_CONFIG"}


@dataclass
class Sim:
    cwd: Path  # where it runs, and so where its printed command works as printed
    urls: dict[str, str]
    printed: list[str]  # the example command it printed, as words

    @property
    def port(self) -> int:
        found = re.search(r":(\d+)/", self.urls["openai"])
        assert found, self.urls
        return int(found[1])

    @property
    def prefix(self) -> list[str]:
        """The words that run conclave, as printed (before the subcommand)."""
        return self.printed[: self.printed.index("confer")]

    @property
    def options(self) -> list[str]:
        """The printed --set options."""
        start = self.printed.index("--set")
        return self.printed[start:]


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sim]:
    cwd = tmp_path_factory.mktemp("sim")
    # `python -m conclave sim` is what the `conclave sim` command runs (cli.cmd_sim).
    proc = subprocess.Popen(
        [sys.executable, "-m", "conclave", "sim", "--port", "0"],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
    )
    try:
        assert proc.stdout is not None and proc.stderr is not None
        urls = dict(proc.stdout.readline().split() for _ in range(3))
        command = ""
        while not command.startswith("  "):
            command = proc.stderr.readline()
            assert command, "conclave sim printed no command to point conclave at it"
        yield Sim(cwd, urls, shlex.split(command))
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def run(words: list[str], cwd: Path) -> dict[str, Any]:
    done = subprocess.run(words, cwd=cwd, env=ENV, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def assert_clean(result: dict[str, Any]) -> None:
    assert "invalid_envelope" not in json.dumps(result)
    assert result["degraded"] is False and result["degraded_reasons"] == []


def test_the_printed_command_runs_as_printed_with_review_and_synthesis(sim: Sim) -> None:
    assert sim.printed[len(sim.prefix) :][:4] == ["confer", "Which option?", "--review", "--synthesize"]
    result = run([*sim.printed, "--json"], sim.cwd)
    assert_clean(result)
    assert len(result["review"]["rankings"]) == 3
    assert result["synthesis"]["envelope"]["answer"].startswith("[simulated sim-claude]")
    assert all(a["text"].startswith("[simulated ") for a in result["answers"]), "plain questions, plain text"


def test_its_set_options_run_a_two_round_coordinate_with_a_revision(sim: Sim) -> None:
    task = ["coordinate", "Design a rate limiter", "--rounds", "2", "--json"]
    result = run([*sim.prefix, *task, *sim.options], sim.cwd)
    assert_clean(result)
    first, second = result["rounds"]
    assert [c["envelope"]["verdict"] for c in first["critiques"]] == ["revise", "revise"]
    assert second["proposal"]["envelope"]["revision_notes"]
    assert result["converged"] is True and result["synthesis"]["envelope"]["answer"]


def docs_config(port: int) -> str:
    """docs/development.md's config file for `conclave sim`, on `port` rather than 8900."""
    found = re.search(r"<!-- sim-config -->\n```yaml\n(.*?)```", DOCS.read_text(encoding="utf-8"), re.DOTALL)
    assert found, "docs/development.md lost its sim-config block"
    assert "8900" in found[1]
    return found[1].replace("8900", str(port))


def test_the_documented_config_file_runs_confer_and_coordinate(sim: Sim) -> None:
    (sim.cwd / "sim.yaml").write_text(docs_config(sim.port), encoding="utf-8")
    config = ["--config", "sim.yaml", "--json"]
    conferred = run([*sim.prefix, "confer", "Which option?", "--review", "--synthesize", *config], sim.cwd)
    assert_clean(conferred)
    assert conferred["usage"]["cost_usd"] > 0, "the documented members carry prices"
    debated = run([*sim.prefix, "coordinate", "Design a rate limiter", "--rounds", "2", *config], sim.cwd)
    assert_clean(debated)
    assert debated["rounds_run"] == 2
