"""The static types of a kind's handler and options: what mypy checks ``register`` and ``@kind``
against (public through :mod:`sqla_jobs.kinds`).

A handler has one of three shapes, each generic in the kind's payload model; the options are a
TypedDict of :class:`~sqla_jobs.KindOptions`' fields. Types only: at run time ``register`` checks
the same things (``takes_session``, ``KindOptions(**options)``) for code mypy did not see.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar, overload

from pydantic import BaseModel

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession
    from sqlalchemy.orm import Session
    from typing_extensions import TypedDict

    from sqla_jobs.backoff import Backoff
    from sqla_jobs.context import JobContext
    from sqla_jobs.rate_limit import RateLimit
    from sqla_jobs.unique import Unique

M = TypeVar("M", bound=BaseModel)
M_contra = TypeVar("M_contra", bound=BaseModel, contravariant=True)
R = TypeVar("R")

#: ``(payload, ctx)``, sync or async: its result is ignored (awaited if it is awaitable).
PayloadHandler = Callable[[M, "JobContext"], object]


#: What a sync handler that takes a ``Session`` may return: None, or the result a kind with
#: ``results=True`` stores. Never a coroutine: an ``async def`` taking a ``Session`` would never run.
SessionResult = None | bool | int | float | str | list[Any] | dict[str, Any] | BaseModel
RS = TypeVar("RS", bound=SessionResult)


class SessionHandler(Protocol[M_contra]):
    """``(payload, ctx, session)``, sync: run with the ``Session`` its job completes in.

    It returns None, or the result a kind with ``results=True`` stores (``SessionResult``):
    never a coroutine, so an ``async def`` taking a ``Session``, whose coroutine would never run,
    does not fit (it takes an ``AsyncSession``).
    """

    def __call__(
        self, payload: M_contra, ctx: JobContext, session: Session, /
    ) -> SessionResult: ...


class AsyncSessionHandler(Protocol[M_contra]):
    """``async (payload, ctx, session)``: run with the ``AsyncSession`` its job completes in."""

    def __call__(
        self, payload: M_contra, ctx: JobContext, session: AsyncSession, /
    ) -> Coroutine[Any, Any, object]: ...


#: A handler of payload model ``M``, in any of the three shapes. The two session shapes are
#: Protocols rather than Callables so that this union holds one Callable: a lambda passed to
#: ``register`` takes its parameter types from it (from a union of several, mypy gives it Any).
HandlerOf = PayloadHandler[M] | SessionHandler[M] | AsyncSessionHandler[M]


if TYPE_CHECKING:
    # TypedDicts for `**options: Unpack[...]`: type checkers only, as sql/tables.py takes
    # Unpack, so typing_extensions stays out of the run-time dependencies.

    class KindOptionArgs(TypedDict, Generic[M], total=False):
        # KindOptions' fields, typed as KindOptions types them (register passes these to
        # KindOptions(**...), so mypy refuses a key or a type KindOptions would not take), but
        # for concurrency_key, which takes the kind's own model. No defaults here: KindOptions
        # holds the only ones.
        queue: str
        priority: int
        max_attempts: int
        max_crashes: int
        backoff: Backoff
        timeout: float | None
        concurrency_key: Callable[[M], str] | None
        concurrency_limit: int | None
        rate_limit: RateLimit | None
        results: bool

    class KindArgs(KindOptionArgs[M], total=False):
        """The keyword options of ``register`` and ``@kind`` (see :class:`KindOptions`): a name
        outside them, or a value of the wrong type, is a mypy error (and a
        :class:`RegistryError` at run time)."""

        #: ``True``: the whole payload; ``False`` or ``None``: not unique.
        unique: Unique | bool | None


class Registers(Protocol):
    """What a :class:`KindDecorator` registers its handler with (a :class:`~sqla_jobs.kinds.Registry`)."""

    @property
    def register(self) -> Callable[..., Any]: ...


class KindDecorator(Generic[M]):
    """What ``@jobs.kind(name, Model, ...)`` returns: it registers the function it decorates as
    the handler of kind ``name`` and returns it unchanged.

    Its overloads are the shapes of :data:`HandlerOf`: a function of another model or another
    shape matches none, which mypy reports at the decorator (naming the first overload's shape
    as the one expected, whatever the function's shape). Each returns its shape with the
    function's own result type: a type checker cannot say "this very function, provided its
    first parameter takes ``Model``", so parameter names and further defaulted parameters are
    not kept. At run time the function itself is returned.
    """

    __slots__ = ("_model", "_name", "_options", "_registry")

    def __init__(
        self, registry: Registers, name: str, model: type[M], options: KindArgs[M]
    ) -> None:
        self._registry = registry
        self._name = name
        self._model = model
        self._options = options

    @overload
    def __call__(self, handler: Callable[[M, JobContext], R]) -> Callable[[M, JobContext], R]: ...

    @overload
    def __call__(
        self, handler: Callable[[M, JobContext, AsyncSession], Coroutine[Any, Any, R]]
    ) -> Callable[[M, JobContext, AsyncSession], Coroutine[Any, Any, R]]: ...

    @overload
    def __call__(
        self, handler: Callable[[M, JobContext, Session], RS]
    ) -> Callable[[M, JobContext, Session], RS]: ...

    def __call__(self, handler: HandlerOf[M]) -> HandlerOf[M]:
        self._registry.register(self._name, self._model, handler, **self._options)
        return handler
