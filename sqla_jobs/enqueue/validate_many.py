"""What enqueue_many checks before any SQL runs: every payload and option of a batch, as
:mod:`~sqla_jobs.enqueue.validate` checks one job's, into a :class:`~sqla_jobs.enqueue.row.Batch`
of columns. Payloads of one model are checked run by run (for a small payload the per-payload
Python around pydantic is most of the cost); no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic_core import PydanticSerializationError

from sqla_jobs.enqueue import row as _row
from sqla_jobs.enqueue import text as _text
from sqla_jobs.enqueue.meta import MetaArg, metas_json
from sqla_jobs.enqueue.row import Batch, Prepared
from sqla_jobs.enqueue.validate import concurrency, options_of, serialize, unique_of
from sqla_jobs.errors import EnqueueError, InvalidPayloadError
from sqla_jobs.kinds import Kind, Registry
from sqla_jobs.rate_limit import RateLimit, rate_key

_META_AT = _row.NAMES.index("meta")


def prepare_many(
    registry: Registry,
    payloads: Iterable[BaseModel],
    *,
    max_bytes: int,
    queue: str | None,
    priority: int | None,
    max_attempts: int | None,
    first: int = 0,
    meta: str | None = None,
    metas: list[str | None] | None = None,
) -> Batch:
    """:func:`~sqla_jobs.enqueue.validate.prepare` for every payload, into one :class:`Batch`; no I/O. The first bad payload
    or option raises, naming the payload's position (counted from ``first``).

    Payloads come in runs of one model: a run is serialized and validated back in one tight loop
    (for a small payload the per-payload Python around pydantic is most of the cost) and its
    constant columns are filled at once. A run that fails anywhere, or whose kind computes
    concurrency keys, goes through :func:`serialize` payload by payload, which raises the exact
    error at the exact position.

    ``meta`` is the JSON text every job shares, ``metas`` one per payload (both already checked by
    :func:`metas_json`).
    """
    batch = Batch()
    items = payloads if isinstance(payloads, list) else list(payloads)
    # Per payload type: its kind and resolved options, looked up and checked once, as the values
    # its jobs share.
    resolved: dict[type[Any], Prepared] = {}
    start, end = 0, len(items)
    while start < end:
        model = type(items[start])
        stop = start + 1
        while stop < end and type(items[stop]) is model:
            stop += 1
        try:
            entry = resolved.get(model)
            if entry is None:
                if not issubclass(model, BaseModel):
                    raise InvalidPayloadError(
                        "enqueue_many takes instances of registered pydantic models, got "
                        f"{model.__qualname__}"
                    )
                kind = registry.by_model(model)
                entry = resolved[model] = _template(kind, queue, priority, max_attempts, meta)
        except EnqueueError as exc:
            _at(exc, first + start)
            raise
        run = items[start:stop]
        opts = entry.kind.options
        texts = (
            None
            if opts.concurrency_key or opts.unique or _keyed_rate(opts.rate_limit)
            else _serialize_run(entry, run, max_bytes)
        )
        if texts is None:
            for offset, payload in enumerate(run):
                _append_one(batch, entry, payload, first + start + offset, max_bytes)
        else:
            batch.add_run(entry, {"payload": texts})
        start = stop
    if metas is not None:
        batch.columns[_META_AT] = metas
    return batch


def prepare_chunks(
    registry: Registry,
    payloads: list[BaseModel],
    *,
    size: int,
    max_bytes: int,
    queue: str | None,
    priority: int | None,
    max_attempts: int | None,
    meta: MetaArg = None,
) -> Iterator[Batch]:
    """:func:`prepare_many` of ``payloads`` in slices of ``size``, each checked only when it is
    asked for: enqueue_many validates the next slice while the server stores the last one. A bad
    payload raises when its slice is reached, naming its position in ``payloads``. ``meta`` is
    checked at once, before the first slice is asked for (see :func:`metas_json`)."""
    shared, metas = metas_json(meta, len(payloads))
    return _chunks(
        registry, payloads, size, max_bytes, queue, priority, max_attempts, shared, metas
    )


def _chunks(
    registry: Registry,
    payloads: list[BaseModel],
    size: int,
    max_bytes: int,
    queue: str | None,
    priority: int | None,
    max_attempts: int | None,
    shared: str | None,
    metas: list[str | None] | None,
) -> Iterator[Batch]:
    for start in range(0, len(payloads), size):
        yield prepare_many(
            registry,
            payloads[start : start + size],
            max_bytes=max_bytes,
            queue=queue,
            priority=priority,
            max_attempts=max_attempts,
            first=start,
            meta=shared,
            metas=None if metas is None else metas[start : start + size],
        )


def _template(
    kind: Kind,
    queue: str | None,
    priority: int | None,
    max_attempts: int | None,
    meta: str | None = None,
) -> Prepared:
    """The values every job of ``kind`` with these options shares; no payload, no key."""
    q, p, m = options_of(kind, queue, priority, max_attempts)
    return Prepared(
        kind=kind,
        payload="",
        queue=q,
        priority=p,
        max_attempts=m,
        max_crashes=kind.options.max_crashes,
        concurrency_key=None,
        concurrency_limit=None,
        meta=meta,
        # A kind-wide limit's key is the kind's name (the same for every job of the run).
        rate_key=None
        if _keyed_rate(kind.options.rate_limit)
        else rate_key(kind.name, kind.options.rate_limit, None),
    )


def _serialize_run(template: Prepared, run: list[BaseModel], max_bytes: int) -> list[str] | None:
    """The JSON texts of a run of ``kind``'s payloads, checked as :func:`serialize` checks one
    (this is its loop, without the per-payload call and type checks); None if any of them fails
    a check, and the caller then finds which, and why."""
    model = template.kind.model
    to_json = model.__pydantic_serializer__.to_json
    validate_json = model.__pydantic_validator__.validate_json
    texts: list[str] = []
    append = texts.append
    try:
        for payload in run:
            dumped: bytes = to_json(payload, warnings="error")
            if len(dumped) > max_bytes or b"\\u0000" in dumped or _text.REPLACEMENT in dumped:
                return None
            # Validated back and dropped at once: the worker validates the same text.
            validate_json(dumped)
            append(dumped.decode())
    except (ValidationError, PydanticSerializationError):
        return None
    return texts


def _append_one(
    batch: Batch, template: Prepared, payload: BaseModel, index: int, max_bytes: int
) -> None:
    kind = template.kind
    try:
        instance, payload_json = serialize(kind, payload, max_bytes)
        key, limit = concurrency(kind, instance, None)
        limiter = rate_key(kind.name, kind.options.rate_limit, instance)
    except EnqueueError as exc:
        _at(exc, index)
        raise
    batch.add_run(
        template,
        {
            "payload": [payload_json],
            "concurrency_key": [key],
            "concurrency_limit": [limit],
            "rate_key": [limiter],
        },
    )
    unique = unique_of(kind, payload_json, template.queue, None)
    if unique is not None:
        if batch.unique is None:
            batch.unique = [None] * len(batch)
        batch.unique[-1] = unique


def _keyed_rate(limit: RateLimit | None) -> bool:
    """Whether each job's limiter key comes from its payload (``RateLimit(by=)``)."""
    return limit is not None and limit.by is not None


def _at(exc: EnqueueError, index: int) -> None:
    """Prefix ``exc``'s message with the position of the payload it is about."""
    exc.args = (f"payload {index}: {exc.args[0]}", *exc.args[1:])
