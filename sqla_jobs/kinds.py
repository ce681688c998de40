"""The registry: kind string -> payload model -> handler and options.

A kind is a stable string stored with every job; the pydantic model is the payload's schema. Renaming
the model class changes nothing in the database, because only the kind string is stored.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import re
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from pydantic import BaseModel, ValidationError

# The handler and option types have a module of their own (this one is the registry); users import
# them from here, hence `X as X`, which re-exports a name under mypy --strict.
from sqla_jobs._handler_types import AsyncSessionHandler as AsyncSessionHandler
from sqla_jobs._handler_types import HandlerOf as HandlerOf
from sqla_jobs._handler_types import KindDecorator as KindDecorator
from sqla_jobs._handler_types import M as M
from sqla_jobs._handler_types import PayloadHandler as PayloadHandler
from sqla_jobs._handler_types import SessionHandler as SessionHandler
from sqla_jobs.backoff import DEFAULT_BACKOFF, Backoff
from sqla_jobs.errors import RegistryError, UnknownKindError
from sqla_jobs.rate_limit import RateLimit
from sqla_jobs.unique import Unique

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from sqla_jobs._handler_types import KindArgs as KindArgs
    from sqla_jobs._handler_types import KindOptionArgs

#: A handler as a :class:`Kind` holds it, its payload model erased (register takes a
#: :data:`HandlerOf` the model): ``(payload, ctx)`` or ``(payload, ctx, session)``, sync or
#: async (:attr:`Kind.wants_session` says which); the registering calls type it precisely.
Handler = Callable[..., Awaitable[object] | object]

#: Queue and kind names: a safe character set, bounded. They are always bound parameters, never
#: interpolated into SQL, but they also travel in NOTIFY payloads and logs, so keep them plain.
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:\-]{0,127}$")


def check_name(what: str, value: object) -> str:
    """Return ``value`` if it is a valid queue or kind name, else raise ``ValueError``."""
    if not isinstance(value, str) or not NAME_RE.fullmatch(value):
        raise ValueError(
            f"invalid {what} name {value!r}: use 1-128 characters from A-Z a-z 0-9 _ . : - "
            "starting with a letter or digit"
        )
    return value


def load_payload(model: type[M], stored: object) -> M:
    """Validate a stored payload against ``model`` the way enqueue validated it: as JSON.

    ``stored`` is the jsonb text (what the worker fetches) or its decoded value. Validating the
    JSON text matters twice: a strict model takes datetimes and UUIDs as the strings JSON holds
    (in Python mode it would refuse them), and pydantic's parser bounds nesting where Python's
    ``json`` module raises ``RecursionError``. Raises ``ValidationError``.
    """
    text = stored if isinstance(stored, (str, bytes)) else json.dumps(stored)
    # What model_validate_json calls, minus its wrapper: this runs once per job a worker runs.
    instance: M = model.__pydantic_validator__.validate_json(text)
    return instance


def describe_errors(exc: ValidationError) -> str:
    """Where each error is and what it is, never the input: payload values must not reach
    ``last_error`` or the logs."""
    return f"{exc.error_count()} error(s): " + "; ".join(
        f"{'.'.join(map(str, e['loc'])) or '<root>'}: {e['msg']}"
        for e in exc.errors(include_url=False, include_input=False)
    )


@dataclass(frozen=True)
class KindOptions:
    """Per-kind defaults; each may be overridden per enqueue where it makes sense."""

    queue: str = "default"
    #: Lower runs first (-32768 .. 32767).
    priority: int = 0
    #: Handler failures before the job is dead.
    max_attempts: int = 10
    #: Expired leases (worker killed, node drained) before the job is dead.
    max_crashes: int = 3
    backoff: Backoff = DEFAULT_BACKOFF
    #: Seconds a handler may run before it is cancelled and counted as a failure; None: no limit.
    timeout: float | None = None
    #: Derives a job's concurrency key from its payload (e.g. ``lambda p: str(p.customer_id)``):
    #: at most ``concurrency_limit`` jobs with the same key run at once, across all workers.
    concurrency_key: Callable[[Any], str] | None = None
    #: Jobs per key running at once (default 1 when a key function is given). A kind with a limit
    #: but no key function takes its key per enqueue (``enqueue(..., concurrency_key=...)``).
    concurrency_limit: int | None = None
    #: What makes two jobs of this kind the same job (:class:`~sqla_jobs.Unique`; ``True``: the
    #: whole payload): at most one of them at a time in the states that count. None: not unique.
    unique: Unique | None = None
    #: At most so many starts per window (:class:`~sqla_jobs.RateLimit`). None: no rate limit.
    rate_limit: RateLimit | None = None
    #: Store what the handler returns with the job's completion (JSON, at most
    #: ``MAX_RESULT_BYTES``, 64 KiB), for its children's ``ctx.parent_results`` and ``jobs.result``.
    #: False: the return value is ignored and nothing is stored.
    results: bool = False


#: The largest result a kind with ``results=True`` may store, in bytes of JSON.
MAX_RESULT_BYTES = 64 * 1024


@dataclass(frozen=True)
class Kind:
    """One registered kind: its string, payload model, handler (optional for enqueue-only
    processes) and options."""

    name: str
    model: type[BaseModel]
    handler: Handler | None
    options: KindOptions = field(default_factory=KindOptions)
    #: The handler takes a third argument, the Session its writes and the job's completion
    #: commit in (an ``AsyncSession`` for an async handler).
    wants_session: bool = False


def takes_session(name: str, handler: Handler | None) -> bool:
    """Whether ``handler`` is ``(payload, ctx, session)`` rather than ``(payload, ctx)``; raise
    :class:`RegistryError` if it can take neither, so a wrong signature fails at import, not at
    the first run."""
    if handler is None:
        return False
    if not callable(handler):
        raise RegistryError(f"kind {name!r}: the handler must be callable, got {handler!r}")
    try:
        params = list(inspect.signature(handler).parameters.values())
    except (TypeError, ValueError):  # a builtin without a signature: trust it
        return False
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    varargs = any(p.kind is p.VAR_POSITIONAL for p in params)
    required = [p for p in params if p.default is p.empty and p.kind is not p.VAR_POSITIONAL]
    if (
        (len(positional) < 2 and not varargs)
        or any(p.kind is p.KEYWORD_ONLY for p in required)
        or len([p for p in positional if p.default is p.empty]) > 3
    ):
        raise RegistryError(
            f"kind {name!r}: its handler {getattr(handler, '__qualname__', handler)!r} must take "
            "(payload, ctx) or (payload, ctx, session)"
        )
    return len(positional) >= 3 and positional[2].default is positional[2].empty


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def validate_options(options: KindOptions) -> None:
    """Raise ``RegistryError`` for options that cannot work."""
    try:
        check_name("queue", options.queue)
    except ValueError as exc:
        raise RegistryError(str(exc)) from None
    if not _is_int(options.priority) or not -32768 <= options.priority <= 32767:
        raise RegistryError(f"priority must be an int in [-32768, 32767], got {options.priority!r}")
    for what in ("max_attempts", "max_crashes"):
        value = getattr(options, what)
        if not _is_int(value) or not 1 <= value <= 2**31 - 1:
            raise RegistryError(f"{what} must be an int in [1, 2147483647], got {value!r}")
    # `not > 0` rather than `<= 0`: NaN compares false both ways.
    if options.timeout is not None and not options.timeout > 0:
        raise RegistryError(f"timeout must be > 0 seconds, got {options.timeout}")
    if options.concurrency_limit is not None and not 1 <= options.concurrency_limit <= 2**31 - 1:
        raise RegistryError(f"concurrency_limit must be >= 1, got {options.concurrency_limit}")
    if options.concurrency_key is not None and not callable(options.concurrency_key):
        raise RegistryError("concurrency_key must be a function of the payload returning a str")
    if options.rate_limit is not None and not isinstance(options.rate_limit, RateLimit):
        raise RegistryError(f"rate_limit must be a RateLimit(...), got {options.rate_limit!r}")
    if not isinstance(options.results, bool):
        raise RegistryError(f"results must be True or False, got {options.results!r}")


def _unique(name: str, model: type[BaseModel], unique: object) -> Unique | None:
    """The kind's :class:`Unique`, checked against its model (``True``: the whole payload)."""
    if unique is False:
        return None
    if unique is True:
        unique = Unique()
    if not isinstance(unique, Unique):
        raise RegistryError(f"kind {name!r}: unique must be a Unique(...) or True, got {unique!r}")
    try:
        return unique.check(model)
    except ValueError as exc:
        raise RegistryError(f"kind {name!r}: {exc}") from None


class Registry:
    """Maps kind strings to :class:`Kind` and payload models back to their kind.

    Registering a kind string twice, or one model under two kinds, raises :class:`RegistryError`.
    """

    def __init__(self) -> None:
        self._by_name: dict[str, Kind] = {}
        self._by_model: dict[type[BaseModel], Kind] = {}

    def register(
        self,
        name: str,
        model: type[M],
        handler: HandlerOf[M] | None = None,
        **options: Unpack[KindArgs[M]],
    ) -> Kind:
        """Register ``model`` as the payload of kind ``name``, with its handler and options.

        The handler takes ``(payload, ctx)``, sync or async, or ``(payload, ctx, session)``: a sync
        function a ``Session``, an ``async`` one an ``AsyncSession``, the session its job
        completes in (:data:`HandlerOf`). Options (:class:`KindArgs`, defaults in
        :class:`KindOptions`): ``queue``, ``priority`` (lower runs first), ``max_attempts``
        (handler failures before dead), ``max_crashes`` (expired leases before dead), ``backoff``
        (:class:`Backoff`), ``timeout`` (seconds), ``concurrency_key`` (a function of the payload
        returning a str), ``concurrency_limit`` (jobs per key running at once, default 1 with a key
        function), ``unique`` (:class:`~sqla_jobs.Unique`, or ``True``: the whole payload),
        ``rate_limit`` (:class:`~sqla_jobs.RateLimit`) and ``results`` (store the handler's
        return value with the completion). The kind string is what is stored: renaming the class is safe. A process that only enqueues
        may register without a handler.

        mypy checks the handler's payload type against ``model``, its shape, and each option's
        name and type. At run time a handler of no shape, a kind or model registered already, or
        an unknown or unworkable option raises :class:`RegistryError` and registers nothing.
        """
        try:
            check_name("kind", name)
        except ValueError as exc:
            raise RegistryError(str(exc)) from None
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            raise RegistryError(f"kind {name!r}: the payload model must be a pydantic BaseModel")
        if name in self._by_name:
            raise RegistryError(f"kind {name!r} is already registered")
        if model in self._by_model:
            raise RegistryError(
                f"model {model.__qualname__} is already registered as kind "
                f"{self._by_model[model].name!r}; use one model per kind"
            )
        unique = options.pop("unique", None)
        rest: KindOptionArgs[M] = options  # KindOptions' own fields
        try:
            opts = KindOptions(**rest)
        except TypeError as exc:  # an unknown option, in code mypy did not check
            raise RegistryError(f"kind {name!r}: {exc}") from None
        if opts.concurrency_key is not None and opts.concurrency_limit is None:
            opts = dataclasses.replace(opts, concurrency_limit=1)
        if unique is not None:
            opts = dataclasses.replace(opts, unique=_unique(name, model, unique))
        validate_options(opts)
        # Stored erased: which shape it is, takes_session finds out (Kind.wants_session).
        stored = cast("Handler | None", handler)
        session = takes_session(name, stored)
        kind = Kind(name=name, model=model, handler=stored, options=opts, wants_session=session)
        self._by_name[name] = kind
        self._by_model[model] = kind
        return kind

    def kind(self, name: str, model: type[M], **options: Unpack[KindArgs[M]]) -> KindDecorator[M]:
        """Decorator form of :meth:`register`: ``@jobs.kind("send_invoice", SendInvoice)`` registers
        the function below it as the kind's handler, checked as :meth:`register` checks it, and
        returns it unchanged."""
        return KindDecorator(self, name, model, options)

    def by_name(self, name: str) -> Kind:
        """The kind registered as ``name``; :class:`UnknownKindError` if there is none."""
        try:
            return self._by_name[name]
        except KeyError:
            raise UnknownKindError(
                f"kind {name!r} is not registered; register it with jobs.register()/@jobs.kind()"
            ) from None

    def by_model(self, model: type[BaseModel]) -> Kind:
        """The kind whose payload model is ``model``; :class:`UnknownKindError` if there is none."""
        try:
            return self._by_model[model]
        except KeyError:
            raise UnknownKindError(
                f"{model.__qualname__} is not a registered payload model; register it with "
                "jobs.register(kind, model) before enqueueing"
            ) from None

    def kind_named(self, name: str) -> Kind | None:
        """The kind registered as ``name``, or None."""
        return self._by_name.get(name)

    def __iter__(self) -> Iterator[Kind]:
        return iter(self._by_name.values())

    def __len__(self) -> int:
        return len(self._by_name)

    def queues(self) -> list[str]:
        """The distinct default queues of the registered kinds, sorted."""
        return sorted({k.options.queue for k in self})
