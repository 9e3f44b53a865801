"""A task function's parameters, read once, and a job's arguments checked against them.

``enqueue(add, args=[1, 2, 3])`` for ``def add(a, b)`` would otherwise be stored and fail
with a TypeError on every attempt. ``inspect.signature()`` costs more than the check
itself, so it is read when the task is registered; and the most common calls (positional
arguments only, to a function of plain parameters) are counted instead of bound, since
``Signature.bind`` costs about as much as the rest of an ``enqueue_many()`` job's checks.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from django_dbqueue.exceptions import InvalidJobArguments

_PLAIN = inspect.Parameter.POSITIONAL_OR_KEYWORD
_ANYTHING = [inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD]


class Parameters:
    """What a registered function's calls must fit."""

    __slots__ = ("anything", "fewest", "most", "signature")

    def __init__(self, function: Callable[..., Any]) -> None:
        self.signature = inspect.signature(function)
        kinds = [p.kind for p in self.signature.parameters.values()]
        self.anything = kinds == _ANYTHING  # (*args, **kwargs)
        # Positional arguments that fit a function of plain parameters, when no keyword
        # argument is given: from those without a default to all (None: bind instead).
        self.fewest: int | None = None
        self.most = len(kinds)
        if all(kind is _PLAIN for kind in kinds):
            self.fewest = sum(p.default is p.empty for p in self.signature.parameters.values())

    def check(self, path: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
        """Raise InvalidJobArguments, naming the parameter, when the function could not be
        called with ``args`` and ``kwargs``."""
        if self.anything or (
            not kwargs and self.fewest is not None and self.fewest <= len(args) <= self.most
        ):
            return
        try:
            self.signature.bind(*args, **kwargs)
        except TypeError as exc:
            given = f" ({len(args)} given)" if "positional" in str(exc) else ""
            raise InvalidJobArguments(
                f"the arguments do not fit {path}({self.names()}): {exc}{given}."
            ) from None

    def names(self) -> str:
        """The parameters without their annotations (strings under PEP 563)."""
        return ", ".join(
            str(p.replace(annotation=p.empty)) for p in self.signature.parameters.values()
        )
