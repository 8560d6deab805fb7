"""The council's vote over structured answers (conclave.deliberation.vote): which fields are voted,
how values agree, who wins, and when there is a consensus."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from conclave.deliberation.vote import tally, voted_fields

CHOICE = {
    "type": "object",
    "properties": {
        "choice": {"type": "string", "enum": ["a", "b", "c", "d"]},
        "reason": {"type": "string"},
    },
}
AMOUNT = {"type": "object", "properties": {"amount": {"type": "number"}}}
DATABASE = {"type": "object", "properties": {"db": {"type": "string", "enum": ["postgres"]}}}
FLAG = {"type": "object", "properties": {"ok": {"type": "boolean"}}}


def panel(*values: Any, field: str = "choice") -> list[tuple[str, dict[str, Any] | None]]:
    """Members p1, p2, ... answering `field` with each value, in panel order."""
    return [(f"p{i}", {field: value}) for i, value in enumerate(values, 1)]


def field_of(vote: dict[str, Any], name: str) -> dict[str, Any]:
    return next(f for f in vote["fields"] if f["field"] == name)


def test_a_unanimous_choice_is_the_consensus() -> None:
    vote = tally(CHOICE, panel("a", "a", "a")).to_dict()
    assert vote == {
        "fields": [
            {
                "field": "choice",
                "winner": "a",
                "votes": 3,
                "of": 3,
                "share": 1.0,
                "unanimous": True,
                "dissent": [],
            }
        ],
        "consensus": {"choice": "a"},
        "reason": None,
        "not_counted": [],
    }


def test_a_strict_majority_wins_and_names_the_dissent_in_panel_order() -> None:
    vote = tally(CHOICE, panel("b", "a", "a", "c", "a")).to_dict()
    choice = field_of(vote, "choice")
    assert (choice["winner"], choice["votes"], choice["of"], choice["share"]) == ("a", 3, 5, 0.6)
    assert choice["unanimous"] is False
    assert choice["dissent"] == [{"provider": "p1", "value": "b"}, {"provider": "p4", "value": "c"}]
    assert vote["consensus"] == {"choice": "a"}
    assert vote["reason"] is None


def test_a_two_two_tie_has_no_winner_and_no_consensus() -> None:
    vote = tally(CHOICE, panel("a", "b", "b", "a")).to_dict()
    choice = field_of(vote, "choice")
    assert (choice["winner"], choice["votes"], choice["of"], choice["share"]) == (None, 2, 4, 0.5)
    assert [d["provider"] for d in choice["dissent"]] == ["p1", "p2", "p3", "p4"]
    assert vote["consensus"] is None
    assert vote["reason"] == "no strict majority on 'choice': 2 of 4 (a tie)"


def test_a_plurality_of_two_in_five_is_no_majority() -> None:
    vote = tally(CHOICE, panel("a", "a", "b", "b", "c")).to_dict()
    assert field_of(vote, "choice")["winner"] is None  # a three-way split: a and b tie at 2
    assert vote["reason"] == "no strict majority on 'choice': 2 of 5 (a tie)"
    vote = tally(CHOICE, panel("a", "a", "b", "c", "d")).to_dict()
    choice = field_of(vote, "choice")
    assert (choice["winner"], choice["votes"], choice["of"], choice["share"]) == ("a", 2, 5, 0.4)
    assert vote["consensus"] is None
    assert vote["reason"] == "no strict majority on 'choice': 2 of 5"


def test_exactly_half_is_not_a_majority() -> None:
    vote = tally(CHOICE, panel("a", "b", "a", "c")).to_dict()
    choice = field_of(vote, "choice")
    assert (choice["winner"], choice["votes"], choice["of"], choice["share"]) == ("a", 2, 4, 0.5)
    assert vote["consensus"] is None
    assert vote["reason"] == "no strict majority on 'choice': 2 of 4"


def test_numbers_agree_within_the_tolerance() -> None:
    loose = tally(AMOUNT, panel(100, 104, field="amount"), tolerance=0.05).to_dict()
    assert field_of(loose, "amount")["winner"] == 100  # the first given
    assert field_of(loose, "amount")["unanimous"] is True
    assert loose["consensus"] == {"amount": 100}

    tight = tally(AMOUNT, panel(100, 104, field="amount"), tolerance=0.03).to_dict()
    assert field_of(tight, "amount")["winner"] is None
    assert tight["reason"] == "no strict majority on 'amount': 1 of 2 (a tie)"

    exact = tally(AMOUNT, panel(100, 100.5, field="amount")).to_dict()  # tolerance defaults to 0
    assert field_of(exact, "amount")["winner"] is None


def test_agreement_within_a_tolerance_is_not_transitive_so_each_candidate_is_counted() -> None:
    vote = tally(AMOUNT, panel(10, 10.5, 11, field="amount"), tolerance=0.05).to_dict()
    amount = field_of(vote, "amount")
    assert (amount["winner"], amount["votes"], amount["of"], amount["unanimous"]) == (10.5, 3, 3, True)
    assert amount["dissent"] == []
    assert vote["consensus"] == {"amount": 10.5}


def test_strings_agree_after_nfc_case_folding_and_collapsed_whitespace() -> None:
    vote = tally(DATABASE, panel("Postgres ", "postgres", "POSTGRES", field="db")).to_dict()
    db = field_of(vote, "db")
    assert (db["winner"], db["votes"], db["unanimous"]) == ("Postgres ", 3, True)  # the first spelling

    composed, decomposed = "caf\u00e9", "cafe\u0301"
    spaced = {"type": "object", "properties": {"name": {"type": "string", "enum": [composed]}}}
    assert tally(spaced, panel(composed, decomposed, field="name")).to_dict()["consensus"] == {
        "name": composed
    }

    street = {"type": "object", "properties": {"street": {"type": "string", "enum": ["Straße"]}}}
    vote = tally(street, panel("Straße", "STRASSE", "  strasse\t", field="street")).to_dict()
    assert field_of(vote, "street")["unanimous"] is True

    words = tally(
        {}, panel("new  york", "New\nYork", "new-york", field="city"), vote_fields=["city"]
    ).to_dict()
    assert field_of(words, "city")["dissent"] == [{"provider": "p3", "value": "new-york"}]


def test_a_boolean_never_agrees_with_a_number() -> None:
    schema = {"type": "object", "properties": {"x": {"type": ["boolean", "integer"]}}}
    vote = tally(schema, panel(True, 1, True, field="x")).to_dict()
    x = field_of(vote, "x")
    assert (x["winner"], x["votes"]) == (True, 2)
    assert x["dissent"] == [{"provider": "p2", "value": 1}]
    vote = tally(schema, panel(False, 0, field="x")).to_dict()
    assert field_of(vote, "x")["winner"] is None


def test_integers_and_floats_agree_when_equal() -> None:
    vote = tally(AMOUNT, panel(3, 3.0, -0.0, 0.0, 3, field="amount")).to_dict()
    amount = field_of(vote, "amount")
    assert (amount["winner"], amount["votes"], amount["of"]) == (3, 3, 5)
    assert [d["value"] for d in amount["dissent"]] == [-0.0, 0.0]
    zeros = tally(AMOUNT, panel(-0.0, 0, field="amount")).to_dict()
    assert field_of(zeros, "amount")["unanimous"] is True


def test_members_without_a_valid_answer_are_not_counted() -> None:
    answers = [("p1", {"choice": "a"}), ("p2", None), ("p3", {"choice": "a"}), ("p4", None)]
    vote = tally(CHOICE, answers).to_dict()
    choice = field_of(vote, "choice")
    assert (choice["votes"], choice["of"], choice["unanimous"]) == (2, 2, True)
    assert vote["not_counted"] == ["p2", "p4"]
    assert vote["consensus"] == {"choice": "a"}


def test_a_missing_optional_field_is_a_dissent_with_no_value() -> None:
    answers = [("p1", {"choice": "a"}), ("p2", {"reason": "no choice"}), ("p3", {"choice": "a"})]
    vote = tally(CHOICE, answers).to_dict()
    choice = field_of(vote, "choice")
    assert (choice["winner"], choice["votes"], choice["of"], choice["share"]) == ("a", 2, 3, 0.6667)
    assert choice["dissent"] == [{"provider": "p2", "value": None}]
    assert vote["consensus"] == {"choice": "a"}


def test_free_text_fields_are_not_voted_and_never_block_a_consensus() -> None:
    assert voted_fields(CHOICE) == ("choice",)
    answers = [("p1", {"choice": "a", "reason": "fast"}), ("p2", {"choice": "a", "reason": "cheap"})]
    vote = tally(CHOICE, answers).to_dict()
    assert [f["field"] for f in vote["fields"]] == ["choice"]
    assert vote["consensus"] == {"choice": "a"}


def test_vote_fields_adds_a_free_text_field() -> None:
    assert voted_fields(CHOICE, ["reason", "choice", "extra", "extra"]) == ("choice", "reason", "extra")
    answers: list[tuple[str, dict[str, Any] | None]] = [
        ("p1", {"choice": "a", "reason": "Fast", "extra": [1, {"b": 2, "a": 1}]}),
        ("p2", {"choice": "a", "reason": "fast ", "extra": [1, {"a": 1, "b": 2}]}),
        ("p3", {"choice": "a", "reason": "cheap", "extra": None}),
    ]
    vote = tally(CHOICE, answers, vote_fields=["reason", "extra"]).to_dict()
    assert [f["field"] for f in vote["fields"]] == ["choice", "reason", "extra"]
    assert field_of(vote, "reason")["dissent"] == [{"provider": "p3", "value": "cheap"}]
    assert field_of(vote, "extra")["dissent"] == [
        {"provider": "p3", "value": None}
    ]  # objects by canonical JSON
    assert vote["consensus"] == {"choice": "a", "reason": "Fast", "extra": [1, {"b": 2, "a": 1}]}


def test_voted_fields_follow_the_schema_order_and_types() -> None:
    schema = {
        "type": "object",
        "properties": {
            "note": {"type": "string"},
            "count": {"type": "integer"},
            "ok": {"type": "boolean"},
            "size": {"enum": ["s", "m", "l"]},
            "score": {"type": "number"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "maybe": {"type": ["number", "null"]},
        },
    }
    assert voted_fields(schema) == ("count", "ok", "size", "score", "maybe")


def test_a_schema_with_nothing_to_vote_on_has_no_consensus() -> None:
    schema = {"type": "object", "properties": {"answer": {"type": "string"}}}
    vote = tally(schema, [("p1", {"answer": "x"}), ("p2", {"answer": "x"})]).to_dict()
    assert vote == {
        "fields": [],
        "consensus": None,
        "reason": "nothing to vote on: the schema has no boolean, number or enum field, and vote_fields names none",
        "not_counted": [],
    }


def test_no_valid_answers_at_all() -> None:
    vote = tally(CHOICE, [("p1", None), ("p2", None)]).to_dict()
    assert vote == {
        "fields": [
            {
                "field": "choice",
                "winner": None,
                "votes": 0,
                "of": 0,
                "share": 0.0,
                "unanimous": False,
                "dissent": [],
            }
        ],
        "consensus": None,
        "reason": "no member gave a valid answer",
        "not_counted": ["p1", "p2"],
    }


def test_the_consensus_holds_every_voted_fields_winner_and_the_first_failure_is_the_reason() -> None:
    schema = {
        "type": "object",
        "properties": {
            "choice": {"type": "string", "enum": ["a", "b"]},
            "ok": {"type": "boolean"},
            "n": {"type": "integer"},
            "why": {"type": "string"},
        },
    }
    agreed = [
        ("p1", {"choice": "a", "ok": True, "n": 3, "why": "x"}),
        ("p2", {"choice": "a", "ok": False, "n": 3, "why": "y"}),
        ("p3", {"choice": "b", "ok": True, "n": 3, "why": "z"}),
    ]
    vote = tally(schema, agreed).to_dict()
    assert vote["consensus"] == {"choice": "a", "ok": True, "n": 3}
    assert vote["reason"] is None

    split = [*agreed[:2], ("p3", {"choice": "b", "ok": False, "n": 4}), ("p4", {"choice": "b", "ok": True})]
    vote = tally(schema, split).to_dict()
    assert vote["consensus"] is None
    assert vote["reason"] == "no strict majority on 'choice': 2 of 4 (a tie)"
    assert field_of(vote, "n")["dissent"] == [
        {"provider": "p3", "value": 4},
        {"provider": "p4", "value": None},
    ]


def test_a_field_no_valid_answer_gives_blocks_the_consensus() -> None:
    vote = tally(CHOICE, [("p1", {"reason": "x"}), ("p2", {})]).to_dict()
    assert field_of(vote, "choice")["dissent"] == [
        {"provider": "p1", "value": None},
        {"provider": "p2", "value": None},
    ]
    assert vote["reason"] == "no strict majority on 'choice': 0 of 2 (no valid answer gives it)"


@given(st.lists(st.one_of(st.booleans(), st.none()), max_size=12))
def test_booleans_the_majority_wins_and_there_is_a_consensus_exactly_when_it_is_strict(
    values: list[bool | None],
) -> None:
    answers = [(f"p{i}", None if v is None else {"ok": v}) for i, v in enumerate(values)]
    vote = tally(FLAG, answers)
    yes, no = values.count(True), values.count(False)
    of = yes + no
    (ok,) = vote.fields
    majority = True if yes > no else False if no > yes else None
    assert ok.winner is majority
    assert (ok.votes, ok.of) == (max(yes, no), of)
    assert (vote.consensus is None) == (majority is None)
    assert vote.consensus is None or vote.consensus == {"ok": majority}
    assert len(ok.dissent) == (of if majority is None else min(yes, no))
    assert vote.not_counted == tuple(p for p, value in answers if value is None)
