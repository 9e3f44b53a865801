"""A task function's parameters, read once, and a job's arguments checked against them.

``enqueue(add, args=[1, 2, 3])`` for ``def add(a, b)`` would otherwise be stored and fail
with a TypeError on every attempt. ``inspect.signature()`` costs more than the check
itself, so it is read when the task is registered; and calls of a function of plain
parameters (no ``*``, ``/`` or ``**``), the most common, are counted instead of bound:
``Signature.bind`` costs 5 to 10 times as much (docs/security.md, "Arguments").
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

    __slots__ = ("anything", "fewest", "most", "names", "position", "signature")

    def __init__(self, function: Callable[..., Any]) -> None:
        self.signature = inspect.signature(function)
        kinds = [p.kind for p in self.signature.parameters.values()]
        self.anything = kinds == _ANYTHING  # (*args, **kwargs)
        # Positional arguments that fit a function of plain parameters, when no keyword
        # argument is given: from those without a default to all (None: bind instead).
        self.fewest: int | None = None
        self.most = len(kinds)
        self.names = tuple(self.signature.parameters)
        self.position = {name: index for index, name in enumerate(self.names)}
        if all(kind is _PLAIN for kind in kinds):
            self.fewest = sum(p.default is p.empty for p in self.signature.parameters.values())

    def check(self, path: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
        """Raise InvalidJobArguments, naming the parameter, when the function could not be
        called with ``args`` and ``kwargs``."""
        if self.anything or (self.fewest is not None and self._counted(len(args), kwargs)):
            return
        try:
            self.signature.bind(*args, **kwargs)
        except TypeError as exc:
            given = f" ({len(args)} given)" if "positional" in str(exc) else ""
            raise InvalidJobArguments(
                f"the arguments do not fit {path}({self.described()}): {exc}{given}."
            ) from None

    def _counted(self, given: int, kwargs: Mapping[str, Any]) -> bool:
        """Do ``given`` positional arguments and ``kwargs`` fit plain parameters? Each
        keyword names a parameter after the positional ones, and every parameter
        without a default is given."""
        if not kwargs:
            return self.fewest is not None and self.fewest <= given <= self.most
        if given > self.most:
            return False
        position = self.position
        for name in kwargs:
            if position.get(name, -1) < given:
                return False
        for name in self.names[given : self.fewest or 0]:
            if name not in kwargs:
                return False
        return True

    def described(self) -> str:
        """The parameters without their annotations (strings under PEP 563)."""
        return ", ".join(
            str(p.replace(annotation=p.empty)) for p in self.signature.parameters.values()
        )
