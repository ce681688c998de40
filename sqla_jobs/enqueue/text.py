"""Text PostgreSQL cannot store: a lone surrogate (``"\\ud800"``), which has no UTF-8 form.

Python's ``str`` may hold one (``json.loads`` makes one of an escaped half of a pair, and a
``surrogateescape`` decode of bad bytes others), and nothing refuses it until the driver encodes
the statement's parameters, or COPY its data: a ``UnicodeEncodeError`` out of the SQL, which on the
COPY path also aborts the caller's transaction. Enqueue looks for one here, before any SQL, and only
where a cheaper test says it may be there: an ASCII string (``str.isascii`` reads a flag) cannot
hold one, and a payload that pydantic could dump holds one only where it wrote U+FFFD in its place.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

from sqla_jobs.errors import InvalidTextError

#: What pydantic's JSON dump writes for a dict key it cannot encode (U+FFFD, in UTF-8), where it
#: refuses a value with a PydanticSerializationError instead.
REPLACEMENT = b"\xef\xbf\xbd"
#: How pydantic words the serialization error of a value with a lone surrogate.
SERIALIZATION_MESSAGE = "surrogates not allowed"


def encodes(text: str) -> bool:
    """Whether ``text`` has a UTF-8 form (holds no lone surrogate)."""
    if text.isascii():
        return True
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def check(what: str, field: str, text: str) -> None:
    """Raise :class:`InvalidTextError` if ``text`` (``what``, for the message) holds a lone
    surrogate."""
    if not encodes(text):
        raise InvalidTextError(_message(what, text), field=field)


def check_payload(kind: str, payload: object) -> None:
    """Raise :class:`InvalidTextError` naming the first string of ``payload`` (a value, or a key
    of a mapping) that holds a lone surrogate; return if none does."""
    try:
        found = _find(payload, "")
    except RecursionError:  # nested deeper than Python recurses: let the caller's error stand
        return
    if found is not None:
        where, text = found
        raise InvalidTextError(_message(f"payload for kind {kind!r}: {where}", text), field=where)


def _message(what: str, text: str) -> str:
    return (
        f"{what} holds a lone surrogate ({text!r}), which has no UTF-8 form and cannot be stored; "
        "decode the input strictly (an escaped half of a pair in JSON gives one) or drop it"
    )


def _find(value: Any, path: str) -> tuple[str, str] | None:
    """(where, the string) of the first string in ``value`` that does not encode, or None."""
    if isinstance(value, str):
        return None if encodes(value) else (f"field {path or '<root>'}", value)
    if isinstance(value, BaseModel):
        fields = {name: getattr(value, name, None) for name in type(value).model_fields}
        return _find_in(fields | (value.__pydantic_extra__ or {}), path)
    if isinstance(value, Mapping):
        return _find_in(value, path)
    if isinstance(value, (list, tuple, set, frozenset)):
        for i, item in enumerate(value):
            found = _find(item, f"{path}[{i}]")
            if found is not None:
                return found
    return None


def _find_in(mapping: Mapping[Any, Any], path: str) -> tuple[str, str] | None:
    for key, item in mapping.items():
        if isinstance(key, str) and not encodes(key):
            return f"a key of field {path or '<root>'}", key
        name = str(key) if not path else f"{path}.{key}"
        found = _find(item, name)
        if found is not None:
            return found
    return None
