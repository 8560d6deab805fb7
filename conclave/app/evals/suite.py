"""An eval suite: the questions, each with the answer that scores it, read once before any call.

Three shapes are read, so that a user's own questions and the common public sets need no
conversion:

- Conclave's own JSON Lines, one item per line, each checked against
  `schemas/eval.item.json`: `{id, question, context?, answer, kind, choices?, tolerance?, rubric?}`.
- GSM8K-style JSON Lines: `question`, and an `answer` whose last `#### N` is the number (commas
  removed); such a line has no `kind`, and gets the id `line-<n>` when it has none.
- MMLU-style CSV: the question, its options, the answer letter; with or without a header row.

Every problem is a `SuiteError` naming the suite and the line, and is raised before anything
is sent: a run that stopped at item 40 over a typo in item 41 would have spent money for
nothing. A choice item's answer is kept as its letter whatever the file gave (the letter or
the option's text), so scoring has one thing to compare. `--limit N` keeps the first N items in
file order, after the whole file is checked.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
import unicodedata
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Literal, cast, get_args

from conclave.core.errors import ConclaveError
from conclave.core.records import record
from conclave.schema.schemas import first_error, json_path
from conclave.schema.strictjson import strict_decoder

Kind = Literal["exact", "number", "choice", "judge"]
KINDS: tuple[str, ...] = get_args(Kind)

ITEM_SCHEMA = "eval.item.json"
DATA_DIR = Path(__file__).resolve().parent / "data"  # shipped in the wheel with the package
BUILTIN_PREFIX = "builtin:"
BUILTIN: tuple[str, ...] = ("basic",)

MIN_CHOICES, MAX_CHOICES = 2, 26  # lettered A..Z
_GSM8K_MARK = "####"
_DECODER = strict_decoder("the suite line")  # duplicate keys and NaN are errors, not silently kept


@record(kw_only=True)
class Item:
    """One question and what scores it. `answer`: a float for number items, the option's letter
    for choice items (even when the file gave its text), else the text. `line`: the 1-based line
    of the file it came from (for a CSV row, the line the row starts on)."""

    id: str
    question: str
    kind: Kind
    answer: str | float
    context: str | None = None
    choices: tuple[str, ...] = ()  # option texts, lettered A, B, C... in order
    tolerance: float | None = None
    rubric: str | None = None
    line: int = 0


@record
class Suite:
    """The items of one suite, in file order. `name`: `builtin:<name>` or the path as given."""

    name: str
    items: tuple[Item, ...]


class SuiteError(ConclaveError):
    """A suite that cannot be run as written; the message is `<name> line <n>: <what and the fix>`
    (or `<name>: ...` for the file as a whole). The CLI exits 2 on it, having sent nothing."""

    code = "invalid_suite"

    def __init__(self, message: str, *, suite: str = "", line: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.suite = suite
        self.line = line

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.line is not None:
            out["line"] = self.line
        return out


def _error(suite: str, line: int | None, problem: str) -> SuiteError:
    where = f"{suite} line {line}" if line is not None else suite
    return SuiteError(f"{where}: {problem}", suite=suite, line=line)


def letters(count: int) -> tuple[str, ...]:
    """The option letters of `count` choices: ("A", "B", ...). ValueError past Z."""
    if not 0 <= count <= MAX_CHOICES:
        raise ValueError(f"count must be 0..{MAX_CHOICES}, not {count}")
    return tuple(chr(ord("A") + index) for index in range(count))


# ------------------------------------------------------------------ how answers read

# Quotes a model (or a suite's author) may wrap an answer in, each with its closing mark.
_QUOTES = {'"': '"', "'": "'", "`": "`", "\u201c": "\u201d", "\u2018": "\u2019", "\u00ab": "\u00bb"}
# A number as people write it: digits with an optional fraction and exponent; thousands may be
# grouped by commas (1,234,567), which are then dropped.
_NUMBER = re.compile(r"[+-]?(?:(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?", re.ASCII)


def normalize(text: str) -> str:
    """The form exact answers are compared in: canonical caseless (NFC, case folded), runs of
    whitespace as one space, and surrounding quotes and a trailing period stripped, so that
    `"Paris."` and `paris` agree and `New  York` and `new york` do. scoring.py scores by it and
    the loader reads a choice answer given as an option's text by it: one rule for both."""
    folded = unicodedata.normalize("NFC", unicodedata.normalize("NFD", text).casefold())
    out = " ".join(folded.split())
    while True:
        stripped = out.removesuffix(".").strip()
        if len(stripped) >= 2 and _QUOTES.get(stripped[0]) == stripped[-1]:
            stripped = stripped[1:-1].strip()
        if stripped == out:
            return out
        out = stripped


def parse_number(text: str) -> float | None:
    """`text` as a finite number when it is one, written plainly: digits, an optional sign,
    fraction and exponent, thousands optionally grouped by commas ("1,234.5"). None for anything
    else, units and currency signs included ("42 km", "$5"): a number field must hold a number,
    and guessing which part of a phrase was meant would score luck."""
    written = text.strip()
    if not _NUMBER.fullmatch(written):
        return None
    return _finite(float(written.replace(",", "")))


def _finite(value: float) -> float | None:
    """`value` as a float when it is a finite one (an int too large for a float is not)."""
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


# ------------------------------------------------------------------ loading


def load_suite(spec: str, *, limit: int | None = None) -> Suite:
    """The suite `spec` names: `builtin:<name>`, a `.jsonl` (or `.json`, read as JSON Lines)
    path, or a `.csv` path (MMLU-style). Every line is checked, then the first `limit` items
    kept. SuiteError for anything wrong, naming the line; ValueError for a limit below 1."""
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be at least 1, not {limit}")
    path = _locate(spec)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise _error(spec, None, f"cannot be read: {exc.strerror or exc}") from None
    try:
        text = data.decode("utf-8-sig")  # a BOM from a spreadsheet's export is no error
    except UnicodeDecodeError as exc:
        raise _error(spec, _line_at(data, exc.start), "is not UTF-8 text; save the file as UTF-8") from None
    rows = _csv_items(spec, text) if path.suffix.lower() == ".csv" else _jsonl_items(spec, text)
    items = _unique(spec, list(rows))
    if not items:
        raise _error(spec, None, "has no items: write one item per line (blank lines are skipped)")
    return Suite(name=spec, items=tuple(items[:limit] if limit is not None else items))


def _line_at(data: bytes, offset: int) -> int:
    """The 1-based line holding byte `offset` of `data`."""
    return data.count(b"\n", 0, offset) + 1


def _locate(spec: str) -> Path:
    """The file `spec` names; SuiteError for an unknown built-in, a missing file, or a file
    whose kind its extension does not say."""
    if spec.startswith(BUILTIN_PREFIX):
        name = spec.removeprefix(BUILTIN_PREFIX)
        if name not in BUILTIN:
            known = ", ".join(BUILTIN_PREFIX + known for known in BUILTIN)
            raise _error(spec, None, f"is not a built-in suite; the built-in suites are: {known}")
        return DATA_DIR / f"{name}.jsonl"
    path = Path(spec)
    if not path.is_file():
        hint = f" (a built-in suite is named {BUILTIN_PREFIX}<name>)" if ":" in spec else ""
        raise _error(spec, None, f"no such file{hint}")
    if path.suffix.lower() not in (".jsonl", ".json", ".csv"):
        raise _error(
            spec,
            None,
            f"is neither JSON Lines nor CSV: name the file *.jsonl (or *.json) for JSON Lines, *.csv for "
            f"MMLU-style rows, not {path.suffix or 'with no extension'}",
        )
    return path


def _unique(suite: str, items: list[Item]) -> list[Item]:
    """`items` unchanged; SuiteError naming both lines when two share an id, since results are
    keyed by item id (a resumed run would take one's answer for the other's)."""
    seen: dict[str, int] = {}
    for item in items:
        if item.id in seen:
            raise _error(
                suite,
                item.line,
                f"id {item.id!r} is also the id of line {seen[item.id]}; give every item its own id",
            )
        seen[item.id] = item.line
    return items


# ------------------------------------------------------------------ JSON Lines


def _jsonl_items(suite: str, text: str) -> Iterator[Item]:
    # Split at line feeds only: str.splitlines would also split at U+2028, which JSON strings may hold.
    for number, raw in enumerate(text.split("\n"), 1):
        if not raw.strip():
            continue
        try:
            value = _DECODER.decode(raw)
        except ValueError as exc:  # json.JSONDecodeError and StrictJSONError alike
            problem = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc)
            raise _error(
                suite, number, f"is not valid JSON ({problem}); write one JSON object per line"
            ) from None
        if not isinstance(value, dict):
            raise _error(
                suite,
                number,
                f"must be a JSON object (one item per line), not {_json_kind(value)}",
            )
        yield _gsm8k_item(suite, number, value) if _is_gsm8k(value) else _conclave_item(suite, number, value)


def _json_kind(value: Any) -> str:
    if isinstance(value, list):
        return "an array (a whole suite as one JSON array? write one item per line instead)"
    if isinstance(value, str):
        return "a string"
    return "a number" if isinstance(value, int | float) and not isinstance(value, bool) else json.dumps(value)


def _is_gsm8k(value: Mapping[str, Any]) -> bool:
    """A line with no `kind` whose answer is text holding `#### N`."""
    answer = value.get("answer")
    return "kind" not in value and isinstance(answer, str) and _GSM8K_MARK in answer


def _gsm8k_item(suite: str, line: int, value: Mapping[str, Any]) -> Item:
    question = value.get("question")
    if not isinstance(question, str) or not question.strip():
        raise _error(suite, line, "a GSM8K-style line needs a non-empty string 'question'")
    raw = cast(str, value["answer"]).rsplit(_GSM8K_MARK, 1)[1].strip()
    number = parse_number(raw)
    if number is None:
        raise _error(
            suite,
            line,
            f"the answer after '{_GSM8K_MARK}' must be a number (thousands separated by commas at most), "
            f"not {raw[:40]!r}",
        )
    given = value.get("id")
    ident = given if isinstance(given, str) and given.strip() else f"line-{line}"
    return Item(id=ident, question=question, kind="number", answer=number, line=line)


def _conclave_item(suite: str, line: int, value: Mapping[str, Any]) -> Item:
    """A line in Conclave's format, checked against its schema and then against what a schema
    cannot say (which fields each kind takes, and a choice answer that names an option)."""
    error = first_error(ITEM_SCHEMA, value)
    if error is not None:
        raise _error(suite, line, _schema_problem(json_path(error), error.message, value))
    kind = cast(Kind, value["kind"])
    for name, wanted in (("choices", "choice"), ("tolerance", "number"), ("rubric", "judge")):
        if name in value and kind != wanted:
            raise _error(suite, line, f"'{name}' applies to {wanted} items only, not to {kind} items")
    answer = _answer(suite, line, kind, value)
    tolerance = value.get("tolerance")
    return Item(
        id=value["id"],
        question=value["question"],
        kind=kind,
        answer=answer,
        context=value.get("context"),
        choices=tuple(choice.strip() for choice in value.get("choices", ())),
        tolerance=float(tolerance) if tolerance is not None else None,
        rubric=value.get("rubric"),
        line=line,
    )


def _schema_problem(path: str, message: str, value: Mapping[str, Any]) -> str:
    """The validator's verdict, with the fix where it is not obvious from it."""
    text = f"{path}: {message}" if path != "$" else message
    if "kind" not in value:
        return (
            f"{text}; every item needs a 'kind' ({', '.join(KINDS)}) — or, for a GSM8K-style line, an "
            f"'answer' ending in '{_GSM8K_MARK} <number>'"
        )
    if "'id' is a required property" in message:
        return f"{text}; every item needs a unique 'id' (a non-empty string)"
    return text


def _answer(suite: str, line: int, kind: Kind, value: Mapping[str, Any]) -> str | float:
    """The item's answer as scoring compares it (see Item)."""
    answer = value["answer"]
    if kind == "number":
        number = _finite(answer) if isinstance(answer, int | float) else parse_number(answer)
        if number is None:
            raise _error(suite, line, f"a number item's answer must be a finite number, not {answer!r}")
        return number
    text = answer if isinstance(answer, str) else json.dumps(answer)  # 1969 as the text "1969"
    if kind == "choice":
        if "choices" not in value:
            raise _error(
                suite, line, f"a choice item needs 'choices', {MIN_CHOICES} to {MAX_CHOICES} options"
            )
        return _choice_letter(suite, line, text, tuple(value["choices"]))
    if kind == "exact" and not normalize(text):
        raise _error(suite, line, "an exact item's answer is blank once normalized; give the expected text")
    return text


def _choice_letter(suite: str, line: int, answer: str, choices: tuple[str, ...]) -> str:
    """The letter `answer` names: a letter in range (either case), or an option's text.
    SuiteError when it names neither, or names two options at once."""
    names = letters(len(choices))
    wanted = normalize(answer)
    by_text = [names[index] for index, choice in enumerate(choices) if normalize(choice) == wanted]
    letter = wanted.upper() if wanted.upper() in names else None
    if letter is not None:
        if any(other != letter for other in by_text):
            raise _error(
                suite,
                line,
                f"the answer {answer!r} is ambiguous: it is letter {letter} and the text of option "
                f"{by_text[0]}; give the letter",
            )
        return letter
    if len(set(by_text)) == 1:
        return by_text[0]
    if by_text:
        raise _error(
            suite, line, f"the answer {answer!r} is the text of options {', '.join(by_text)}; give the letter"
        )
    raise _error(
        suite,
        line,
        f"the answer {answer!r} names no option: give a letter {names[0]}..{names[-1]} or one of the "
        "choices' texts",
    )


# ------------------------------------------------------------------ MMLU-style CSV

_LETTER = re.compile(r"[A-Za-z]")


def _csv_items(suite: str, text: str) -> Iterator[Item]:
    """Rows of `question, option..., answer letter` (MMLU has four options). The first row is
    a header when its last cell is not a letter. Every row has the first data row's width."""
    reader = csv.reader(io.StringIO(text, newline=""))
    width: int | None = None
    first = True
    end = 0  # the line the previous row ended on
    try:
        for row in reader:
            start, end = end + 1, reader.line_num
            cells = [cell.strip() for cell in row]
            if not any(cells):
                continue
            if first:
                first = False
                if not _LETTER.fullmatch(cells[-1]):
                    continue  # the header row
            if width is None:
                width = len(cells)
                if not MIN_CHOICES + 2 <= width <= MAX_CHOICES + 2:
                    raise _error(
                        suite,
                        start,
                        f"has {width} cells; an MMLU-style row is: question, {MIN_CHOICES} to {MAX_CHOICES} "
                        "options (MMLU has 4), answer letter",
                    )
            yield _csv_item(suite, start, cells, width)
    except csv.Error as exc:
        raise _error(suite, reader.line_num, f"is not valid CSV ({exc})") from None


def _csv_item(suite: str, line: int, cells: list[str], width: int) -> Item:
    if len(cells) != width:
        raise _error(
            suite, line, f"has {len(cells)} cells, the rows above {width}: question, options, answer letter"
        )
    question, choices, answer = cells[0], tuple(cells[1:-1]), cells[-1]
    if not question:
        raise _error(suite, line, "the question (the first cell) is blank")
    for letter, choice in zip(letters(len(choices)), choices, strict=True):
        if not choice:
            raise _error(suite, line, f"option {letter} is blank")
    names = letters(len(choices))
    if answer.upper() not in names:
        raise _error(
            suite,
            line,
            f"the last cell must be the answer letter, {names[0]}..{names[-1]}, not {answer[:40]!r}",
        )
    return Item(
        id=f"line-{line}", question=question, kind="choice", answer=answer.upper(), choices=choices, line=line
    )
