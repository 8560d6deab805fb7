"""`@record`: the decorator for values made on every call (requests, usage, completions).

A record is a frozen dataclass to the type checker and a plain slotted dataclass at run time.
A frozen dataclass's `__init__` stores each field through `object.__setattr__`, a C call with
its own argument parsing per field, and a provider call makes several small records. Here
each field is one slot store.

Nothing is lost that the build checks: `mypy --strict` (CI) reads `frozen_default` and
rejects any assignment to a record's field, as it does for `frozen=True`. Records stay
hashable by value (`unsafe_hash`: "unsafe" only for fields that change, and these never do).
Values made once per process (the config, the runtime) keep `frozen=True` and its run-time
guard, which costs them nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar, overload

if TYPE_CHECKING:  # typeshed has `frozen_default` from 3.12; 3.11's typing takes it as a kwarg
    from typing_extensions import dataclass_transform
else:
    from typing import dataclass_transform

T = TypeVar("T")


@overload
def record(cls: type[T], /) -> type[T]: ...


@overload
def record(*, kw_only: bool = False) -> Callable[[type[T]], type[T]]: ...


@dataclass_transform(frozen_default=True, field_specifiers=(field,))
def record(cls: type[T] | None = None, /, *, kw_only: bool = False) -> type[T] | Callable[[type[T]], type[T]]:
    """`@dataclass(frozen=True, slots=True)` as the type checker sees it; see the module.
    `@record(kw_only=True)` makes every field keyword-only, as dataclass's own option does."""

    def make(cls: type[T]) -> type[T]:
        return dataclass(slots=True, unsafe_hash=True, kw_only=kw_only)(cls)

    return make if cls is None else make(cls)
