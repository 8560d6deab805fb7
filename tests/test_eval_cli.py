"""`conclave eval` as a user runs it: a subprocess, its exit status, what it prints and the files it
writes; against the simulated panel, in the demo and pointed at a running panel with `--set`."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from conclave.app.sim import SimPanel
from conclave.app.sim.simulated import set_options
from conclave.schema.schemas import first_error
from tests.test_cli import conclave


def results(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines()]


def test_the_demo_prints_both_cases_and_writes_every_file(tmp_path: Path) -> None:
    done = conclave("eval", "--demo", "--out", "runs", cwd=tmp_path, timeout=180)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "independent: the vote beat its best member, single:sim-openai" in out
    assert "shared-mistakes: the vote did not beat its best member, single:sim-openai" in out
    assert out.count("single:sim-anthropic") >= 2 and "95% CI" in out
    runs = sorted((tmp_path / "runs").iterdir())
    assert [run.name.split("-demo-")[1] for run in runs] == ["independent", "shared-mistakes"]
    for run in runs:
        lines = results(run)
        assert len(lines) == 60 * 5
        assert all(first_error("eval.result.json", line) is None for line in lines)
        summary = json.loads((run / "summary.json").read_text())
        assert first_error("eval.summary.json", summary) is None
        assert summary["files"] == {
            "results": "results.jsonl",
            "chart_png": "chart.png",
            "chart_svg": "chart.svg",
        }
        assert (run / "chart.png").read_bytes().startswith(b"\x89PNG")
        assert "<svg" in (run / "chart.svg").read_text()
        by = {row["strategy"]: row for row in summary["strategies"]}
        correct = sum(1 for line in lines if line["strategy"] == "vote" and line["correct"])
        assert by["vote"]["correct"] == correct and by["vote"]["scored"] == 60


def test_a_malformed_suite_line_is_named_and_nothing_is_written(tmp_path: Path) -> None:
    (tmp_path / "suite.jsonl").write_text(
        '{"id": "a", "question": "1 + 1?", "answer": 2, "kind": "number"}\n{"id": "b", "question": "x"\n'
    )
    done = conclave("eval", "suite.jsonl", "--out", "run", cwd=tmp_path)
    assert done.returncode == 2 and "suite.jsonl line 2" in done.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["builtin:basic", "--strategies", "majority"], "unknown strategy 'majority'"),
        (["builtin:basic", "--strategies", "single:nobody"], "'nobody', which is not configured"),
        (["builtin:nope"], "builtin"),
        ([], "give a SUITE"),
        (["builtin:basic", "--max-cost", "-1"], "--max-cost"),
    ],
)
def test_bad_arguments_are_refused_before_any_call(tmp_path: Path, args: list[str], said: str) -> None:
    done = conclave("eval", *args, "--out", "run", cwd=tmp_path)
    assert done.returncode == 2 and said in done.stderr, done.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.anyio
async def test_against_a_running_panel_max_cost_refuses_then_a_run_and_its_resume_complete(
    tmp_path: Path,
) -> None:
    async with SimPanel(role_answers=True) as panel:
        pointed = set_options(panel.base_urls())
        prices = [
            "--set",
            "providers.sim-openai.price={input_per_mtok: 1, output_per_mtok: 2}",
            "--set",
            "providers.sim-anthropic.price={input_per_mtok: 1, output_per_mtok: 2}",
            "--set",
            "providers.sim-gemini.price={input_per_mtok: 1, output_per_mtok: 2}",
        ]

        async def run(*args: str) -> tuple[int, str, str]:
            command = [sys.executable, "-m", "conclave", "eval", "builtin:basic", *pointed, *prices, *args]
            env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
            done = await anyio.run_process(command, cwd=tmp_path, env=env, check=False)
            return done.returncode, done.stdout.decode(), done.stderr.decode()

        code, _, err = await run("--limit", "3", "--out", "run", "--max-cost", "0.0001")
        assert code == 2 and "dry-run bound is $" in err and "nothing was sent" in err
        assert panel.received == []
        code, out, err = await run(
            "--limit", "2", "--out", "run", "--strategies", "single:sim-gemini,vote", "--json"
        )
        assert code == 0, err
        summary = json.loads(out)
        assert [row["items"] for row in summary["strategies"]] == [2, 2]
        asked = len(panel.received)
        assert asked == 2 * (3 + 3)
        code, out, err = await run("--limit", "3", "--out", "run", "--strategies", "single:sim-gemini,vote")
        assert code == 2 and "--resume" in err
        code, out, err = await run(
            "--limit", "3", "--out", "run", "--strategies", "single:sim-gemini,vote", "--resume"
        )
        assert code == 0, err
        assert len(panel.received) - asked == 3 + 3, "only the third item was asked"
        assert len(results(tmp_path / "run")) == 6
        assert "single:sim-gemini" in out and "vote" in out


@pytest.mark.anyio
async def test_an_interrupted_run_keeps_its_answers_writes_its_summary_and_resumes(tmp_path: Path) -> None:
    async with SimPanel(role_answers=True, latency_ms=150) as panel:
        base = [
            sys.executable, "-m", "conclave", "eval", "builtin:basic", *set_options(panel.base_urls()),
            "--limit", "6", "--out", "run", "--concurrency", "1", "--strategies", "single:sim-openai,vote",
        ]  # fmt: skip
        env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
        process = await anyio.open_process(base, cwd=tmp_path, env=env)
        results_file = tmp_path / "run" / "results.jsonl"
        with anyio.fail_after(60):
            while not (results_file.exists() and results_file.read_text().count("\n") >= 2):
                await anyio.sleep(0.05)
        process.send_signal(signal.SIGINT)
        with anyio.fail_after(30):
            code = await process.wait()
        await process.aclose()
        assert code == 130
        kept = results(tmp_path / "run")
        assert 2 <= len(kept) < 12
        summary = json.loads((tmp_path / "run" / "summary.json").read_text())
        assert summary["stopped"] == "interrupted" and first_error("eval.summary.json", summary) is None
        done = await anyio.run_process([*base, "--resume"], cwd=tmp_path, env=env, check=False)
        assert done.returncode == 0, done.stderr.decode()
        lines = results(tmp_path / "run")
        pairs = [(line["strategy"], line["item"]) for line in lines]
        assert len(lines) == 12 and len(set(pairs)) == 12, "every pair once: nothing asked twice"
