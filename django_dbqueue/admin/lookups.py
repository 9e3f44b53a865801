"""Lookups in the job list's URL, checked before they reach SQL.

Django's admin turns any ``?field__lookup=value`` on the model's own fields into a
filter, and catches what fails while the filter is built, but not what fails when the
query runs: a year past 9999 (Python's ``datetime`` ends there), a NaN or an infinity
(MariaDB refuses them as a DOUBLE), a number wider than the column, a NUL (PostgreSQL
refuses it in text). Each was a 500 page for any staff user who may view jobs. Here a
value the query could not carry is refused as a bad request (400) first; what passes is
left to Django, which redirects a value it cannot parse to ``?e=1``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from datetime import date, datetime

from django.core.exceptions import FieldDoesNotExist, SuspiciousOperation, ValidationError
from django.db import connections, models, router
from django.http import QueryDict

# Parameters of the change list that are not lookups on the model's fields.
NOT_LOOKUPS = frozenset({"q", "o", "p", "e", "all", "_to_field", "_popup", "_facets"})
# Transforms of a date or datetime that compare with a whole number.
DATE_PARTS = frozenset(
    {"year", "iso_year", "month", "day", "week", "week_day", "iso_week_day", "quarter"}
    | {"hour", "minute", "second"}
)
YEAR_PARTS = frozenset({"year", "iso_year"})
# Years a lookup may name: one short of Python's date range at each end, so the bounds
# Django derives from a year (and their conversion to UTC) stay inside it.
YEARS = range(2, 9999)
PART_VALUES = range(0, 10_000)
INTEGER = re.compile(r"-?[0-9]{1,20}\Z")
DECIMAL = re.compile(r"-?[0-9]{1,400}(\.[0-9]{1,400})?([eE][-+]?[0-9]{1,5})?\Z")


def refuse_crafted_lookups(model: type[models.Model], query: QueryDict) -> None:
    """Raise ``SuspiciousOperation`` (a 400 page) for a lookup in ``query`` whose value
    the database could not compare; return for everything else."""
    for key, values in query.lists():
        if any("\x00" in value for value in values):
            # PostgreSQL cannot compare text with a NUL in it, and no stored value holds one.
            raise SuspiciousOperation("A NUL character in the job list's query string.")
        if key not in NOT_LOOKUPS:
            check_lookup(model, key, values)


def check_lookup(model: type[models.Model], key: str, values: list[str]) -> None:
    name, *rest = key.split("__")
    try:
        field = model._meta.pk if name == "pk" else model._meta.get_field(name)
    except FieldDoesNotExist:
        return  # a list filter's own parameter, or a lookup Django refuses itself
    if not isinstance(field, models.Field) or (rest and rest[-1] == "isnull"):
        return
    texts = list(split(values, rest[-1] if rest else "exact"))
    if rest and rest[-1] == "range" and len(texts) != 2 * len(values):
        raise refuse(key, ",".join(values), "a range is two values")
    part = next((p for p in rest if p in DATE_PARTS), None)
    if isinstance(field, models.DateField) and part is not None:
        allowed = YEARS if part in YEAR_PARTS else PART_VALUES
        for text in texts:
            whole_number(key, text, allowed)
    elif isinstance(field, models.DateField) and "time" not in rest:
        as_date = "date" in rest or not isinstance(field, models.DateTimeField)
        for text in texts:
            in_years(key, text, models.DateField() if as_date else field)
    elif isinstance(field, models.FloatField):
        for text in texts:
            finite(key, text)
    elif isinstance(field, models.IntegerField | models.AutoField) and not rest[-1:] == ["date"]:
        ops = connections[router.db_for_read(model)].ops
        low, high = ops.integer_field_range(field.get_internal_type())
        for text in texts:
            whole_number(
                key, text, range(low if low is not None else -(2**63), (high or 2**63) + 1)
            )


def split(values: list[str], lookup: str) -> Iterable[str]:
    """The values the admin compares: ``__in`` and ``__range`` take comma-separated lists."""
    for value in values:
        if lookup in ("in", "range"):
            yield from value.split(",")
        else:
            yield value


def refuse(key: str, text: str, why: str) -> SuspiciousOperation:
    return SuspiciousOperation(f"Job list lookup {key}={text[:40]!r}: {why}.")


def whole_number(key: str, text: str, allowed: range) -> None:
    # ASCII digits only: int() also takes "١٢٣", spaces and underscores.
    if not INTEGER.match(text) or int(text) not in allowed:
        raise refuse(key, text, f"not a whole number from {allowed.start} to {allowed.stop - 1}")


def finite(key: str, text: str) -> None:
    # float() also takes "nan", "inf" and "1e999" (an infinity): no column holds those.
    if not DECIMAL.match(text) or not math.isfinite(number := float(text)) or abs(number) > 1e308:
        raise refuse(key, text, "not a finite decimal number")


def in_years(key: str, text: str, field: models.Field[object, object]) -> None:
    try:
        value = field.to_python(text)
    except (ValidationError, ValueError, OverflowError):
        return  # Django reports a value it cannot parse itself (?e=1)
    if isinstance(value, date | datetime) and value.year not in YEARS:
        raise refuse(key, text, f"a year outside {YEARS.start}-{YEARS.stop - 1}")
