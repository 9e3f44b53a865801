"""One job's call checked: its arguments (JSON, nesting, NUL, size) and its concurrency key.

What differs from job to job, so ``enqueue_many()`` checks it for each one; the task and
the options it shares with other jobs are checked once (``enqueueing.check_shared``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from json.encoder import c_make_encoder, encode_basestring_ascii  # type: ignore[attr-defined]
from typing import Any, NamedTuple

from django_dbqueue import bounds
from django_dbqueue.exceptions import InvalidJob, InvalidJobArguments
from django_dbqueue.options import BY_NAME, Defaults, Shared

# json.dumps(value, allow_nan=False) without building an encoder per call (which costs
# more than encoding a short argument list): the C encoder json.dumps itself uses,
# made once. Without circular-reference markers: a list that holds itself recurses
# until RecursionError, which is refused as too deep.
_json_encoder = json.JSONEncoder(allow_nan=False)
if c_make_encoder is not None:
    _c_encode = c_make_encoder(
        None,
        _json_encoder.default,
        encode_basestring_ascii,
        None,
        ": ",
        ", ",
        False,
        False,
        False,
    )

    def _encode(value: Any) -> str:
        return "".join(_c_encode(value, 0))

else:  # pragma: no cover - Pythons without the C accelerator

    def _encode(value: Any) -> str:
        return _json_encoder.encode(value)


# A key's limit when neither the call nor the task gives one.
_DEFAULT_LIMIT = BY_NAME["concurrency_limit"].default
# Exact types (not subclasses such as enums, which JSON turns into plain values).
_PLAIN = frozenset({str, int, float, bool, type(None)})


def _check_json(value: list[Any] | dict[str, Any], what: str) -> tuple[Any, str]:
    """(the value as the job will receive it, its JSON text)."""
    if not value:
        return type(value)(), "[]" if isinstance(value, list) else "{}"
    try:
        # Round-trip so what is stored is exactly what the job will receive
        # (tuples become lists) and NaN/Infinity, which JSON lacks, are refused.
        text = _encode(value)
    except RecursionError:
        raise bounds.too_deep(what) from None
    except (TypeError, ValueError) as exc:
        raise InvalidJobArguments(
            f"Job {what} must be JSON-serializable (str, int, float, bool, None, list, dict): "
            f"{exc}. Pass ids or plain data instead of objects."
        ) from None
    # Nesting cannot be deeper than the brackets in the text: most arguments need no walk.
    if text.count("[") + text.count("{") > bounds.MAX_NESTING + 1:
        bounds.check_nesting(value, what)
    if bounds.has_nul(text):
        raise InvalidJob(
            f"Job {what} contain a NUL character (\\x00), which PostgreSQL cannot store in "
            "JSON; encode binary data (e.g. base64) before enqueueing it."
        )
    # The text is ASCII: characters beyond the BMP and lone surrogates alike are escaped
    # as \udXXX, so only such text needs the second look.
    if "\\ud" in text and _has_lone_surrogate(value):
        raise InvalidJob(
            f"Job {what} contain a lone surrogate (e.g. '\\ud800'), which has no UTF-8 "
            "form: no database can store it. Pass text that is valid Unicode."
        )
    items = value.values() if type(value) is dict else value
    if _PLAIN.issuperset(map(type, items)):
        # Flat plain values: the round trip would give back equal values (NaN and
        # infinities were refused above); ``value`` is the caller's copy already.
        return value, text
    return json.loads(text), text


def _has_lone_surrogate(value: Any) -> bool:
    try:
        json.dumps(value, ensure_ascii=False).encode()
    except UnicodeEncodeError:
        return True
    return False


class Call(NamedTuple):
    """A job's arguments and concurrency key, validated (:func:`check_call`)."""

    args: list[Any]
    args_text: str
    kwargs: dict[str, Any]
    kwargs_text: str
    concurrency_key: str | None
    concurrency_limit: int | None


def check_call(
    shared: Shared,
    args: Any,
    kwargs: Any,
    concurrency_key: Any,
    concurrency_limit: Any,
    defaults: Defaults,
) -> Call:
    """Validate one job's arguments (JSON, size) and its concurrency key. Raises InvalidJob."""
    if args is None:
        args = []
    key, limit = _concurrency(shared, concurrency_key, concurrency_limit, args, kwargs)
    kind = type(args)
    job_args: list[Any]
    if (kind is list or kind is tuple) and not args:
        job_args, args_text = [], "[]"
    elif (
        kind is list
        or kind is tuple
        or (isinstance(args, Sequence) and not isinstance(args, str | bytes))
    ):
        job_args, args_text = _check_json(list(args), "args")
    else:
        raise InvalidJob(f"args must be a list or tuple, not {kind.__name__}.")
    if not kwargs:
        if kwargs is not None and not isinstance(kwargs, Mapping):
            raise InvalidJob("kwargs must be a dict with string keys.")
        job_kwargs: dict[str, Any] = {}
        kwargs_text = "{}"
    else:
        if not isinstance(kwargs, Mapping) or not all(isinstance(k, str) for k in kwargs):
            raise InvalidJob("kwargs must be a dict with string keys.")
        job_kwargs, kwargs_text = _check_json(dict(kwargs), "kwargs")
    size = len(args_text) + len(kwargs_text)
    if size > defaults.max_payload_bytes:
        raise InvalidJob(
            f"Job args and kwargs take {size} bytes as JSON, more than "
            f"DBQUEUE['MAX_PAYLOAD_BYTES'] ({defaults.max_payload_bytes}). Store big data "
            "elsewhere (a model, a file) and pass its id."
        )
    if shared.parameters is not None:
        shared.parameters.check(shared.path, job_args, job_kwargs)
    return Call(job_args, args_text, job_kwargs, kwargs_text, key, limit)


def format_concurrency_key(template: str, args: Any, kwargs: Any) -> str:
    """A ``@job``/``@task`` concurrency_key template formatted with a call's arguments."""
    try:
        return template.format(*(args or ()), **(kwargs or {}))
    except (IndexError, KeyError, ValueError, AttributeError) as exc:
        raise InvalidJob(
            f"concurrency_key {template!r} cannot be formatted with this job's arguments: {exc!r}."
        ) from None


def _concurrency(
    shared: Shared, key: Any, limit: Any, args: Any, kwargs: Any
) -> tuple[str | None, int | None]:
    """(concurrency_key, concurrency_limit): the given ones, else the task's defaults,
    whose key is a format string over the job's arguments."""
    if key is None and shared.key_template is not None:
        key = format_concurrency_key(shared.key_template, args, kwargs)
    if limit is None:
        limit = shared.concurrency_limit
    if key is None:
        if limit is not None:
            raise InvalidJob("concurrency_limit needs a concurrency_key.")
        return None, None
    return bounds.check_concurrency_key(key), bounds.check_concurrency_limit(
        _DEFAULT_LIMIT if limit is None else limit
    )
