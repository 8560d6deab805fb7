"""HTML built so that text can only ever be text.

Everything the page shows from a model, a fetched page, a transcript or the event log is untrusted.
The rule is mechanical: `Safe` is markup, and only this module makes it; anything else that reaches
`el` or `escape` (a `str`, a number, a `Safe` that went through `+` or an f-string and so became a
plain `str` again) is escaped with `html.escape`. Tag and attribute names are the code's own
constants, never data, and every attribute value is quoted and escaped. A mistake therefore shows
up as visible `&lt;` on the page, never as markup.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping

Child = object  # a Safe, a str, a number, None (nothing), or an iterable of those


class Safe(str):
    """Markup made by this module."""

    __slots__ = ()


def escape(value: object) -> Safe:
    if isinstance(value, Safe):
        return value
    return Safe(html.escape(str(value), quote=True))


def join(children: Iterable[Child]) -> Safe:
    return Safe("".join(_flatten(children)))


def _flatten(children: Iterable[Child]) -> Iterable[str]:
    for child in children:
        if child is None or child is False:
            continue
        if isinstance(child, str | int | float):
            yield escape(child)
        elif isinstance(child, Iterable):
            yield from _flatten(child)
        else:
            yield escape(child)


def el(tag: str, *children: Child, **attrs: object) -> Safe:
    """`<tag attrs>children</tag>`. Attribute names are Python names: a trailing `_` is dropped
    (`class_`) and other `_` become `-` (`data_live`); None or False leaves one out, True makes it
    bare."""
    return Safe(f"<{tag}{_attributes(attrs)}>{join(children)}</{tag}>")


def void(tag: str, **attrs: object) -> Safe:
    """An element without content or end tag (`meta`, `link`)."""
    return Safe(f"<{tag}{_attributes(attrs)}>")


def _attributes(attrs: Mapping[str, object]) -> str:
    parts = []
    for name, value in attrs.items():
        if value is None or value is False:
            continue
        key = name.rstrip("_").replace("_", "-")
        parts.append(f" {key}" if value is True else f' {key}="{escape(value)}"')
    return "".join(parts)
