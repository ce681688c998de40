"""A job's ``meta`` as enqueue checks it: tags and trace context, stored as a JSON object.

Checked before any SQL, like the payload: an error leaves the caller's transaction usable.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from sqla_jobs.errors import InvalidMetaError

#: Largest ``meta`` of one job, serialized as UTF-8 JSON: meta holds tags and a trace context,
#: not data (which goes in the payload, or in the application's own tables).
MAX_META_BYTES = 8 * 1024
#: What ``enqueue_many(meta=...)`` takes: one mapping for every job, or one (or None) per job.
MetaArg = Mapping[str, Any] | Sequence[Mapping[str, Any] | None] | None
#: A JSON \u0000 escape (odd number of backslashes before u0000): jsonb refuses it.
JSON_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def meta_json(meta: Mapping[str, Any] | None, what: str = "meta") -> str | None:
    """The JSON text of a job's ``meta``, checked: a mapping of str keys (nested ones too) whose
    values JSON stores as they are (no NaN, no NUL, no lone surrogate, no other types), at most
    :data:`MAX_META_BYTES` serialized; None for None. Raises :class:`InvalidMetaError` naming
    ``what``."""
    if meta is None:
        return None
    if not isinstance(meta, Mapping):
        raise InvalidMetaError(
            f"{what} must be a mapping of str keys to JSON values, got {type(meta).__qualname__}"
        )
    bad = _bad_key(meta)
    if bad is not None:
        raise InvalidMetaError(
            f"{what} has a key that is not a str: {bad!r}; JSON object keys are strings"
        )
    try:
        data = json.dumps(
            meta if isinstance(meta, dict) else dict(meta),
            ensure_ascii=False,
            allow_nan=False,
            separators=(",", ":"),
        )
    except (TypeError, ValueError) as exc:
        raise InvalidMetaError(
            f"{what} is not JSON-serializable ({exc}); use str, int, float, bool, None, lists "
            "and dicts of str keys"
        ) from None
    if "\\u0000" in data and JSON_NUL.search(data):
        raise InvalidMetaError(
            f"{what} contains a NUL character (\\u0000), which jsonb cannot store"
        )
    try:
        size = len(data.encode())
    except UnicodeEncodeError:
        raise InvalidMetaError(
            f"{what} contains a lone surrogate, which has no UTF-8 form; PostgreSQL stores only "
            "UTF-8"
        ) from None
    if size > MAX_META_BYTES:
        raise InvalidMetaError(
            f"{what} is {size} bytes as JSON, over the limit of {MAX_META_BYTES}; meta is for "
            "tags and trace context: put data in the payload or in your own tables"
        )
    return data


def _bad_key(value: Any) -> Any:
    """The first key of a mapping in ``value`` (nested in mappings and lists) that is not a str,
    or None. ``json.dumps`` would write 1 and True as "1" and "true": what is read back would not
    be what was given."""
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                return key
            bad = _bad_key(item)
            if bad is not None:
                return bad
    elif isinstance(value, (list, tuple)):
        for item in value:
            bad = _bad_key(item)
            if bad is not None:
                return bad
    return None


def metas_json(meta: MetaArg, count: int) -> tuple[str | None, list[str | None] | None]:
    """``enqueue_many``'s ``meta``, checked: (the JSON text shared by every job, None) for one
    mapping, checked once; (None, one text per job) for a sequence, which must have ``count``
    entries; (None, None) for None. A bad entry raises naming its position."""
    if meta is None:
        return None, None
    if isinstance(meta, Mapping):
        return meta_json(meta), None
    if isinstance(meta, (str, bytes)) or not isinstance(meta, Sequence):
        raise InvalidMetaError(
            "meta must be a mapping (for every job) or a sequence of one mapping or None per job, "
            f"got {type(meta).__qualname__}"
        )
    if len(meta) != count:
        raise InvalidMetaError(
            f"meta has {len(meta)} entries for {count} payloads; give one per payload, or one "
            "mapping for all"
        )
    return None, [meta_json(m, f"meta of payload {i}") for i, m in enumerate(meta)]
