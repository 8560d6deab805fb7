"""Safe arithmetic for the `verify` tool's `math` check: numbers, + - * / // % ** and parentheses.

Nothing is evaluated as code: the expression is parsed to a syntax tree, refused unless every node
is a number or an arithmetic operator, and interpreted node by node. Every limit (tree size,
nesting, integer size, exponent) is checked *before* the operation that would exceed it, so no
expression can hang or exhaust the server. A refusal is an ExpressionRefused saying why.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable

Number = int | float

_MAX_INT_BITS = 10_000
_MAX_NODES = 200
_MAX_NESTING = 50
_MAX_EXPONENT = 1000
_SHOWN_DIGITS = 80  # a longer integer is shown by its ends and its digit count


class ExpressionRefused(Exception):
    """The expression is invalid, not plain arithmetic, or over a limit; the message says which."""


def evaluate(expression: str) -> Number:
    """The value of an arithmetic expression, or ExpressionRefused."""
    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError as exc:
        raise ExpressionRefused(f"invalid expression: {exc.msg}") from exc
    # The parser itself gives up on pathological nesting in these ways.
    except (ValueError, MemoryError, RecursionError) as exc:
        raise ExpressionRefused(f"invalid expression: {exc}") from exc
    _check_shape(tree.body)
    return _eval(tree.body)


def show_number(value: Number) -> str:
    """A number as a verdict quotes it: a float by its repr, a huge integer by its ends."""
    if isinstance(value, float):
        return repr(value)
    digits = str(value)
    if len(digits) <= _SHOWN_DIGITS:
        return digits
    return f"{digits[:30]}…{digits[-30:]} ({len(digits.lstrip('-'))} digits)"


def _check_shape(root: ast.expr) -> None:
    """Refuse anything but numbers and arithmetic, and trees too big or deep, before evaluating.

    Iterative because the parser accepts nesting deeper than the interpreter's recursion limit.
    """
    count, stack = 0, [(root, 1)]
    while stack:
        node, depth = stack.pop()
        count += 1
        if count > _MAX_NODES:
            raise ExpressionRefused(f"expression has more than {_MAX_NODES} nodes")
        if depth > _MAX_NESTING:
            # A chain like 1+2+3 nests one level per operator: say so, or the refusal looks wrong.
            raise ExpressionRefused(
                f"expression is nested deeper than {_MAX_NESTING} levels (each operator adds one)"
            )
        stack.extend((child, depth + 1) for child in _operands(node))


def _operands(node: ast.expr) -> list[ast.expr]:
    if isinstance(node, ast.Constant):
        # `type(...) in` rather than isinstance: True is an int, and complex/str/bytes are constants too.
        if type(node.value) not in (int, float):
            raise ExpressionRefused(
                f"{type(node.value).__name__} constants are not allowed: only int and float numbers"
            )
        return []
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.UAdd | ast.USub):
        return [node.operand]
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        return [node.left, node.right]
    raise ExpressionRefused(f"{_describe(node)} not allowed: only numbers, + - * / // % ** and parentheses")


def _describe(node: ast.expr) -> str:
    names = {
        ast.Name: "names are",
        ast.Call: "function calls are",
        ast.Attribute: "attributes are",
        ast.Subscript: "subscripts are",
        ast.Compare: "comparisons are",
        ast.BoolOp: "boolean operators are",
    }
    for kind, description in names.items():
        if isinstance(node, kind):
            return description
    operator_node = getattr(node, "op", None)
    return f"{type(operator_node or node).__name__} is"


def _eval(node: ast.expr) -> Number:
    """Evaluate a tree `_check_shape` accepted; its depth bound keeps this recursion shallow."""
    if isinstance(node, ast.Constant):
        return _bounded(node.value)
    if isinstance(node, ast.UnaryOp):
        operand = _eval(node.operand)
        return -operand if isinstance(node.op, ast.USub) else operand
    if not isinstance(node, ast.BinOp):  # unreachable after _check_shape; kept as a hard stop
        raise ExpressionRefused(f"{type(node).__name__} not allowed")
    left, right = _eval(node.left), _eval(node.right)
    try:
        return _bounded(_BINARY[type(node.op)](left, right))
    except ZeroDivisionError as exc:
        raise ExpressionRefused("division by zero") from exc
    except OverflowError as exc:
        raise ExpressionRefused(f"float overflow: {exc}") from exc


def _bounded(value: object) -> Number:
    """Every intermediate result must be a finite float or an int within the bit limit."""
    if type(value) is int:
        if value.bit_length() > _MAX_INT_BITS:
            raise ExpressionRefused(f"integer result over the {_MAX_INT_BITS}-bit limit")
        return value
    if type(value) is float:
        if not math.isfinite(value):
            raise ExpressionRefused("float overflow: result is not finite")
        return value
    # A negative number to a fractional power is complex in Python.
    raise ExpressionRefused(f"{type(value).__name__} result not allowed: only real numbers")


def _multiply(left: Number, right: Number) -> Number:
    # A product has at most the sum of its factors' bits: refuse before computing it.
    if isinstance(left, int) and isinstance(right, int) and _bits(left) + _bits(right) > _MAX_INT_BITS + 1:
        raise ExpressionRefused(f"integer product over the {_MAX_INT_BITS}-bit limit")
    return left * right


def _power(base: Number, exponent: Number) -> Number:
    if abs(exponent) > _MAX_EXPONENT:
        raise ExpressionRefused(f"exponent {show_number(exponent)} is over the limit of ±{_MAX_EXPONENT}")
    # An int power has at most bits(base) * exponent bits: refuse before computing it.
    if type(base) is int and type(exponent) is int and abs(base).bit_length() * exponent > _MAX_INT_BITS:
        raise ExpressionRefused(f"integer power over the {_MAX_INT_BITS}-bit limit")
    result: Number = base**exponent
    return result


def _bits(value: int) -> int:
    return value.bit_length()


_BINARY: dict[type[ast.operator], Callable[[Number, Number], Number]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: _multiply,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: _power,
}
