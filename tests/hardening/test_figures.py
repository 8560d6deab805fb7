"""The figures convention and the `scripts/hardening` table (pure; no suite is run)."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from tests.hardening import figures, report


@pytest.mark.parametrize(
    ("value", "total", "target", "expected"),
    [
        (48, 48, "== total", "PASS"),
        (47, 48, "== total", "MISS"),
        (0, None, "== 0", "PASS"),
        (1, None, "== 0", "MISS"),
        (100_000, None, ">= 100000", "PASS"),
        (-9.5, None, "abs <= 10", "PASS"),
        (-10.5, None, "abs <= 10", "MISS"),
        (19.2, None, ">= 19", "PASS"),
        (0, None, 0, "PASS"),
        (3, None, None, None),
        (None, None, "== 0", "MISS"),
    ],
)
def test_verdicts(value: object, total: object, target: object, expected: str | None) -> None:
    assert figures.verdict({"value": value, "total": total, "target": target}) == expected


def test_record_then_table_with_missing_rows_as_not_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(figures.DIR_ENV, str(tmp_path))
    path = figures.record("ssrf: refused via fetch", 41, total=42, target="== total", command="cmd ssrf")
    figures.record("ssrf: refused via fetch", 42, total=42, target="== total", command="cmd ssrf")
    figures.record("extra: something new", 1.23456, target=None)
    saved = orjson.loads(path.read_bytes())
    assert saved["figure"] == "ssrf: refused via fetch" and saved["value"] == 42
    assert {"figure", "value", "total", "target", "command"} <= set(saved)
    assert report.main(["--no-run"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("ssrf: refused via fetch"))
    assert "42 / 42" in row and "PASS" in row and row.endswith("cmd ssrf")
    assert "not run" in next(line for line in out.splitlines() if line.startswith("fault matrix"))
    assert out.index("bad input: structured errors") < out.index("extra: something new")
    figures.record("fuzz: crashes", 2, target="== 0")
    assert report.main(["--no-run", "--markdown"]) == 1
    assert "| fuzz: crashes | 2 | == 0 | MISS |" in capsys.readouterr().out
