"""Default answers to Conclave's role prompts, for models nobody scripted (`conclave sim`).

A deliberation turn ends with an ask that names its role (conclave/prompts/roles/*.user.txt):
a model that sees "Review this proposal on your own" answers as a critic. The answers here are
valid role envelopes, deterministic and labelled `[simulated <model>]` like the plain default,
so `confer --review --synthesize` and `coordinate` run end to end against an unscripted panel.
The critics ask for a revision in round 1 and accept from round 2, so `coordinate --rounds 2`
shows the whole loop. Anything else (a plain question, a tool result) gets no role answer.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Final, Literal

from conclave.app.sim.scenarios import default_answer

Ask = Literal["proposer", "revision", "critic", "reviewer", "synthesizer", "chair"]

_RANK_ASK: Final = "Rank every one of these labels"  # then the labels shown, in order
# Each ask's wording, as the prompt files put it; tests/test_sim_roles.py fails if they drift.
ASKS: Final[tuple[tuple[str, Ask], ...]] = (
    ("Write your proposal for this task", "proposer"),
    ("Revise your proposal in the light of these critiques", "revision"),
    ("Review this proposal on your own", "critic"),
    (_RANK_ASK, "reviewer"),
    ("Write the final answer to the task", "synthesizer"),
    ("Write the final answer to the question", "chair"),
)
_ROUND: Final = re.compile(r"Review round (\d+)\.")
_LABEL: Final = re.compile(r"Response [A-Z]")
_FENCED: Final = re.compile(r"```json\n(.*?)\n```", re.DOTALL)


def which_ask(text: str) -> Ask | None:
    """The role `text` asks for. The ask closes the prompt, after the quoted data, so the one
    found last wins: a quoted answer that happens to contain an ask cannot change the role."""
    found = [(text.rfind(phrase), ask) for phrase, ask in ASKS if phrase in text]
    return max(found)[1] if found else None


def role_answer(model: str, text: str) -> str | None:
    """The JSON envelope `model` answers to the role prompt `text`, or None for a non-role prompt."""
    ask = which_ask(text)
    if ask is None:
        return None
    if ask == "reviewer":
        envelope = _reviewer(model, text)
    elif ask == "critic":
        envelope = _critic(model, _round_number(text))
    elif ask in ("synthesizer", "chair"):
        envelope = _synthesis(model, text, chair=ask == "chair")
    else:
        envelope = _proposal(model, text, revised=ask == "revision")
    return json.dumps(envelope, ensure_ascii=False)


def _proposal(model: str, text: str, *, revised: bool) -> dict[str, Any]:
    envelope: dict[str, Any] = {
        "proposal": default_answer(model, text),
        "rationale": "A simulated proposal: the same prompt always gets the same one.",
        "assumptions": ["Nothing here was reasoned: the simulated panel answers from a script."],
        "confidence": 0.7,
    }
    if revised:
        envelope["revision_notes"] = (
            "Took up the critics' major issue: the revision states its trade-offs; nothing was rejected."
        )
    return envelope


def _critic(model: str, round_number: int) -> dict[str, Any]:
    if round_number >= 2:
        summary = f"[simulated {model}] The revision answers round {round_number - 1}'s issue."
        return {"verdict": "accept", "issues": [], "summary": summary, "confidence": 0.8}
    issue = {
        "severity": "major",
        "description": "The proposal does not say which trade-off it accepts.",
        "suggestion": "Name the trade-off, and why it is acceptable here.",
    }
    summary = f"[simulated {model}] Sound, once it names its trade-off."
    return {"verdict": "revise", "issues": [issue], "summary": summary, "confidence": 0.7}


def _reviewer(model: str, text: str) -> dict[str, Any]:
    labels: list[str] = _LABEL.findall(text[text.rfind(_RANK_ASK) :])
    answers = _quoted_answers(text)
    # Ranked by a digest of each answer, so every reviewer puts the same answers in the same order.
    ranking = sorted(labels, key=lambda label: _digest(answers.get(label) or label))
    notes = {
        label: f"[simulated {model}] placed {n} of {len(ranking)}." for n, label in enumerate(ranking, 1)
    }
    return {"ranking": ranking, "notes": notes, "confidence": 0.6}


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8")).digest()


def _quoted_answers(text: str) -> dict[str, str]:
    """Label -> answer text from the prompt's fenced block; empty when it cannot be read."""
    block = _FENCED.search(text)
    try:
        items = json.loads(block[1]) if block else []
    except ValueError:
        return {}
    if not isinstance(items, list):
        return {}
    return {str(item.get("label")): str(item.get("answer")) for item in items if isinstance(item, dict)}


def _synthesis(model: str, text: str, *, chair: bool) -> dict[str, Any]:
    settled = "the best-ranked answer was followed" if chair else "the final proposal took up the critiques"
    return {
        "answer": default_answer(model, text),
        "confidence": 0.7,
        "resolved": [f"Where the panel differed, {settled}."],
        "dissent": [],
        "rationale": "A simulated synthesis: the same prompt always gets the same one.",
    }


def _round_number(text: str) -> int:
    found = _ROUND.findall(text)
    return int(found[-1]) if found else 1
