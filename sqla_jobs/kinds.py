"""The registry: kind string -> payload model -> handler and options.

A kind is a stable string stored with every job; the pydantic model is the payload's schema. Renaming
the model class changes nothing in the database, because only the kind string is stored.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel, ValidationError

from .backoff import DEFAULT_BACKOFF, Backoff
from .errors import RegistryError, UnknownKindError

if TYPE_CHECKING:
    from .context import JobContext

M = TypeVar("M", bound=BaseModel)
#: A handler takes the validated payload and the job's context; it may be sync or async.
Handler = Callable[[Any, "JobContext"], Awaitable[object] | object]
H = TypeVar("H", bound=Handler)

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


@dataclass(frozen=True)
class Kind:
    """One registered kind: its string, payload model, handler (optional for enqueue-only
    processes) and options."""

    name: str
    model: type[BaseModel]
    handler: Handler | None
    options: KindOptions = field(default_factory=KindOptions)


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
        model: type[BaseModel],
        handler: Handler | None = None,
        **options: Any,
    ) -> Kind:
        """Register ``model`` under the stable kind string ``name`` with its handler and options."""
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
        try:
            opts = KindOptions(**options)
        except TypeError as exc:
            raise RegistryError(f"kind {name!r}: {exc}") from None
        if opts.concurrency_key is not None and opts.concurrency_limit is None:
            opts = dataclasses.replace(opts, concurrency_limit=1)
        validate_options(opts)
        kind = Kind(name=name, model=model, handler=handler, options=opts)
        self._by_name[name] = kind
        self._by_model[model] = kind
        return kind

    def kind(self, name: str, model: type[BaseModel], **options: Any) -> Callable[[H], H]:
        """Decorator form of :meth:`register`: ``@jobs.kind("send_invoice", SendInvoice)``."""

        def decorate(handler: H) -> H:
            self.register(name, model, handler, **options)
            return handler

        return decorate

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
