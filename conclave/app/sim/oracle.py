"""An oracle for the simulated panel: members that answer known questions right with a configured
accuracy, their errors partly correlated, every draw seeded (`conclave eval --demo`).

An `OracleItem` is a question the eval asks, the answer object's field it sets ("value",
"choice" or "answer"), the right value, and plausible wrong ones. `SimPanel(oracle=...)` (or
`set_oracle`) answers a request for structured output whose prompt holds an item's question with
`Oracle.answer`: the object `structured.synthesize` builds for the schema, with the item's field
set to the drawn value and a `reason` labelled `[simulated <model>]`. Scripted replies still come
first, a request with no schema is unaffected, and so is a question the oracle does not know.

The draw model
--------------

Each call of a model on an item is a fresh draw, as from a model sampled at a temperature above
zero. Draw `n` (0, 1, 2, ...) is the `n`-th time this oracle was asked that (model, item): the
oracle counts, so the same sequence of requests always gets the same answers (`reset()` starts
the count again; the panel's `reset()` calls it).

Whether a draw is right is a Gaussian copula. Every member shares the item's difficulty
`z ~ N(0, 1)`, drawn from hash(seed, question); each call has its own noise `e ~ N(0, 1)`, from
hash(seed, model, question, n); and with a `consistency` sigma above zero, a model's own draws on
an item also share its habit `m ~ N(0, 1)`, from hash(seed, model, question), since a model's
samples agree with each other more than with another model's. With `rho` the correlation,

    X = sqrt(rho) * z + sqrt(sigma) * m + sqrt(1 - rho - sigma) * e    (so X ~ N(0, 1))

and the call is right iff `Phi(X) < accuracy`, that is `X < Phi^-1(accuracy)`. Each member's
marginal accuracy is exactly the one configured (X is standard normal whatever `rho` is), while
its errors are correlated with the other members' through `z`: a hard item is hard for everyone.
An accuracy of 1 is always right, 0 always wrong.

A wrong draw takes, with probability `rho`, the item's shared wrong value
(`wrong[hash(seed, question) % len(wrong)]`), with probability `sigma` the model's habitual wrong
value (`wrong[hash(seed, model, question) % len(wrong)]`), else a wrong value chosen by the call's own hash:
correlated members also tend to agree on the same wrong answer, which is what defeats a
majority vote. With `rho = 0` three members of accuracy 0.7 form a majority right about 78% of
the time; with `rho` near 1 the majority is right no more often than its members.

Every draw is a SHA-256 digest of its inputs: the same across processes and runs, and no global
random state is touched. Wrong values are taken among those the request's schema admits (a
number within its bounds, a choice in its enum); an item whose right value the schema cannot
hold is not answered (`None`), and neither is one none of whose wrong values it admits.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any, Final

import orjson

from conclave.app.sim import structured

_STANDARD: Final = NormalDist()
_TAG: Final = "conclave-sim-oracle"


@dataclass(frozen=True, slots=True)
class OracleItem:
    """A question the oracle knows, and how its answer object is filled."""

    question: str  # the question text as the eval sends it (found as a substring of the prompt)
    field: str  # the answer object's field to set ("value", "choice" or "answer")
    correct: Any  # the right value for that field
    wrong: tuple[Any, ...]  # plausible wrong values (at least one)


class Oracle:
    """Seeded answers to known questions (see the module for the draw model).

    `accuracy` maps a MODEL name (what the request names, e.g. "sim-gpt") to the probability a
    call answers right; a model not in it has `default_accuracy`. `correlation` is `rho`, from 0
    (independent errors) to 1 (every member right or wrong on the same items); `consistency` is
    `sigma`, how much a model's own samples of an item agree beyond that (0 to 1 - rho).
    """

    def __init__(
        self,
        items: Sequence[OracleItem],
        accuracy: Mapping[str, float],
        *,
        correlation: float = 0.0,
        consistency: float = 0.0,
        seed: int = 0,
        default_accuracy: float = 0.5,
    ) -> None:
        if not 0.0 <= correlation <= 1.0:
            raise ValueError(f"correlation must be from 0 to 1, not {correlation!r}")
        if not 0.0 <= consistency <= 1.0 - correlation:
            raise ValueError(f"consistency must be from 0 to 1 - correlation, not {consistency!r}")
        _check_accuracy("default_accuracy", default_accuracy)
        for model, value in accuracy.items():
            _check_accuracy(f"accuracy[{model!r}]", value)
        by_question: dict[str, OracleItem] = {}
        for item in items:
            _check_item(item)
            if item.question in by_question:
                raise ValueError(f"question {item.question!r} is given twice")
            by_question[item.question] = item
        self._items = tuple(items)
        self._by_question = by_question
        # Longest first: a question that holds another one as a substring is found before it.
        self._longest_first = sorted(self._items, key=lambda item: len(item.question), reverse=True)
        self._accuracy = dict(accuracy)
        self._default_accuracy = float(default_accuracy)
        self._rho = float(correlation)
        self._sigma = float(consistency)
        self._shared_weight = math.sqrt(self._rho)
        self._habit_weight = math.sqrt(self._sigma)
        self._own_weight = math.sqrt(max(1.0 - self._rho - self._sigma, 0.0))
        self._seed = seed
        self._thresholds: dict[str, float] = {}
        self._draws: dict[tuple[str, str], int] = {}

    # ------------------------------------------------------------------ configuration

    def accuracy_of(self, model: str) -> float:
        """The probability a call of `model` answers right."""
        return float(self._accuracy.get(model, self._default_accuracy))

    def expected(self, question: str) -> Any:
        """The right value for `question` (an item's question exactly); KeyError if unknown."""
        return self._by_question[question].correct

    # ------------------------------------------------------------------ answering

    def find(self, text: str) -> OracleItem | None:
        """The item whose question occurs in `text` (the longest, if several do), or None."""
        exact = self._by_question.get(text)
        if exact is not None:
            return exact
        for item in self._longest_first:
            if item.question in text:
                return item
        return None

    def answer(self, model: str, text: str, schema: Mapping[str, Any]) -> dict[str, Any] | None:
        """`model`'s next answer to the item whose question occurs in `text`, as an object valid
        against `schema`; None when no item's question occurs in `text` (or `schema` cannot hold
        the item's answer)."""
        found = self.find(text)
        return None if found is None else self.draw(model, found, schema)

    def draw(self, model: str, item: OracleItem, schema: Mapping[str, Any]) -> dict[str, Any] | None:
        """`model`'s next draw on `item` (counted), as an object valid against `schema`; None,
        and nothing counted, when `schema` is not an object whose `item.field` can hold the
        item's right value and one of its wrong ones."""
        properties = schema.get("properties")
        if not isinstance(properties, Mapping) or item.field not in properties:
            return None
        slot = properties[item.field]
        if not _admits(slot, item.correct):
            return None
        wrong = tuple(value for value in item.wrong if _admits(slot, value))
        if not wrong:
            return None
        out = structured.synthesize(schema, model=model, question=item.question)
        if not isinstance(out, dict):  # an object schema always synthesizes to a dict
            return None
        key = (model, item.question)
        index = self._draws.get(key, 0)
        self._draws[key] = index + 1
        value, _right = self._outcome(model, item, index, wrong)
        out[item.field] = value
        reason = properties.get("reason")
        if "reason" in out and isinstance(reason, Mapping) and _free_string(reason):
            out["reason"] = _fitted(f"[simulated {model}] {_shown(value)} (oracle draw {index + 1}).", reason)
        return out

    def outcome(self, model: str, question: str, index: int = 0) -> tuple[Any, bool]:
        """What draw `index` of `model` on `question` gives, and whether it is right, without
        counting it (all of the item's wrong values are candidates)."""
        item = self._by_question[question]
        return self._outcome(model, item, index, item.wrong)

    def draws(self, model: str, question: str) -> int:
        """How many times `model` has been asked `question` since the last reset."""
        return self._draws.get((model, question), 0)

    def reset(self) -> None:
        """Start every (model, item) count again: the same requests then get the same answers."""
        self._draws.clear()

    # ------------------------------------------------------------------ the draw

    def _outcome(self, model: str, item: OracleItem, index: int, wrong: tuple[Any, ...]) -> tuple[Any, bool]:
        if self._right(model, item.question, index):
            return item.correct, True
        seed, question = str(self._seed), item.question
        call = (seed, model, question, str(index))
        which = _uniform("shared?", *call)
        if which < self._rho:
            return wrong[_integer("shared wrong", seed, question) % len(wrong)], False
        if which < self._rho + self._sigma:
            return wrong[_integer("habitual wrong", seed, model, question) % len(wrong)], False
        return wrong[_integer("own wrong", *call) % len(wrong)], False

    def _right(self, model: str, question: str, index: int) -> bool:
        threshold = self._thresholds.get(model)
        if threshold is None:
            threshold = self._thresholds[model] = _threshold(self.accuracy_of(model))
        if threshold == math.inf or threshold == -math.inf:
            return threshold > 0
        seed = str(self._seed)
        shared = _normal("item", seed, question) if self._rho > 0.0 else 0.0
        habit = _normal("habit", seed, model, question) if self._sigma > 0.0 else 0.0
        own = _normal("call", seed, model, question, str(index)) if self._own_weight > 0.0 else 0.0
        return self._shared_weight * shared + self._habit_weight * habit + self._own_weight * own < threshold


def _threshold(accuracy: float) -> float:
    """Phi^-1(accuracy), with 0 and 1 as minus and plus infinity."""
    if accuracy <= 0.0:
        return -math.inf
    if accuracy >= 1.0:
        return math.inf
    return _STANDARD.inv_cdf(accuracy)


def _digest(*parts: str) -> bytes:
    return hashlib.sha256("\0".join((_TAG, *parts)).encode("utf-8")).digest()


def _integer(*parts: str) -> int:
    return int.from_bytes(_digest(*parts)[:8], "big")


def _uniform(*parts: str) -> float:
    """Uniform on (0, 1), never either end: 53 bits, each value the middle of its interval."""
    return ((_integer(*parts) >> 11) + 0.5) / 2.0**53


def _normal(*parts: str) -> float:
    return _STANDARD.inv_cdf(_uniform(*parts))


def _check_accuracy(name: str, value: float) -> None:
    if not isinstance(value, int | float) or isinstance(value, bool) or not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be a probability from 0 to 1, not {value!r}")


def _check_item(item: OracleItem) -> None:
    if not item.question:
        raise ValueError("an oracle item needs a question")
    if not item.field:
        raise ValueError(f"item {item.question!r} needs the field its answer sets")
    if not item.wrong:
        raise ValueError(f"item {item.question!r} needs at least one wrong value")
    if any(_same(value, item.correct) for value in item.wrong):
        raise ValueError(f"item {item.question!r} lists its right value among the wrong ones")


def _same(a: Any, b: Any) -> bool:
    """JSON equality: a boolean is never a number."""
    return isinstance(a, bool) == isinstance(b, bool) and bool(a == b)


def _admits(node: Any, value: Any) -> bool:
    """Whether a field's schema admits `value`, by the keywords a scalar answer field uses
    (type, enum, const, numeric bounds, string lengths); any other keyword is taken as met."""
    if not isinstance(node, Mapping):
        return node is not False
    if "const" in node and not _same(node["const"], value):
        return False
    choices = node.get("enum")
    if isinstance(choices, list) and not any(_same(choice, value) for choice in choices):
        return False
    kind = node.get("type")
    kinds = [kind] if isinstance(kind, str) else kind if isinstance(kind, list) else None
    if kinds is not None and not any(_is_type(k, value) for k in kinds):
        return False
    if _is_type("number", value):
        return _within(node, float(value))
    if isinstance(value, str):
        low, high = node.get("minLength"), node.get("maxLength")
        return not (isinstance(low, int) and len(value) < low) and not (
            isinstance(high, int) and len(value) > high
        )
    return True


def _is_type(kind: Any, value: Any) -> bool:
    if kind == "number":
        return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if kind == "integer":
        return _is_type("number", value) and float(value).is_integer()
    if kind == "string":
        return isinstance(value, str)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "null":
        return value is None
    if kind == "array":
        return isinstance(value, list | tuple)
    if kind == "object":
        return isinstance(value, Mapping)
    return True


def _within(node: Mapping[str, Any], value: float) -> bool:
    def bound(key: str) -> float | None:
        found = node.get(key)
        return float(found) if isinstance(found, int | float) and not isinstance(found, bool) else None

    low, high = bound("minimum"), bound("maximum")
    above, below = bound("exclusiveMinimum"), bound("exclusiveMaximum")
    return (
        (low is None or value >= low)
        and (high is None or value <= high)
        and (above is None or value > above)
        and (below is None or value < below)
    )


def _free_string(node: Any) -> bool:
    """A field any sentence may fill: a string with no enum, const or format."""
    if not isinstance(node, Mapping) or any(k in node for k in ("enum", "const", "format", "pattern")):
        return False
    kind = node.get("type", "string")
    return kind == "string" or (isinstance(kind, list) and "string" in kind)


def _fitted(text: str, node: Mapping[str, Any]) -> str:
    low, high = node.get("minLength"), node.get("maxLength")
    if isinstance(low, int) and len(text) < low:
        text += "." * (low - len(text))
    if isinstance(high, int) and len(text) > high:
        text = text[:high]
    return text


def _shown(value: Any) -> str:
    return value if isinstance(value, str) else orjson.dumps(value, default=str).decode()
