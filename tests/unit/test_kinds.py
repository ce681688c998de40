"""The kinds registry: kind string -> payload model -> handler and options. No database."""

from __future__ import annotations

import math
import string
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel
from sqlalchemy.exc import UnboundExecutionError
from sqlalchemy.orm import Session

from sqla_jobs import (
    Backoff,
    ConfigurationError,
    EnqueueError,
    InvalidQueueNameError,
    Jobs,
    KindOptions,
    RegistryError,
    SqlaJobsError,
    UnknownKindError,
)
from sqla_jobs.kinds import Registry


class SendInvoice(BaseModel):
    invoice_id: int


class ResizeImage(BaseModel):
    path: str


def handle_invoice(payload: SendInvoice, ctx: object) -> None:
    """A handler; never called here."""


# The rule for kind and queue names, written out independently of the package's regex so a slip
# in the regex (an anchor, a Unicode class) shows up as a disagreement.
_ALNUM = string.ascii_letters + string.digits
_REST = _ALNUM + "_.:-"


def is_safe_name(name: str) -> bool:
    return 1 <= len(name) <= 128 and name[0] in _ALNUM and all(c in _REST for c in name[1:])


UNSAFE_NAMES = [
    "",
    " ",
    "send invoice",
    "send_invoice ",
    "it's",
    'say "hi"',
    "a;b",
    "x'; DROP TABLE sqla_jobs_job; --",
    "a\x00b",
    "\x00",
    "trailing\n",
    "tab\there",
    "back\\slash",
    "a" * 129,
    "_leading_underscore",
    "-leading-dash",
    ".leading-dot",
    "ünïcode",
    "名前",
    "zero\u200bwidth",
    "\uff11fullwidth",  # FULLWIDTH DIGIT ONE: a "digit" to \d, not to [0-9]
    "\u212aelvin",  # KELVIN SIGN: folds to K under IGNORECASE
    "emoji\U0001f600",
]

SAFE_NAMES = ["a", "0", "send_invoice", "billing.invoices:v2", "A-b_c.d:e", "a" * 128, "9" * 128]

#: Text that leans on the characters that matter: the safe set, quotes, separators, NUL and
#: control characters, and arbitrary Unicode; plus strings around the length bound.
names = st.one_of(
    st.text(
        alphabet=st.sampled_from(_REST + "'\";\x00 \n\t\\%$(){}[]/*`ñé名\u200b\U0001f600"),
        max_size=140,
    ),
    st.text(max_size=40),
    st.text(alphabet=st.sampled_from(_REST), min_size=120, max_size=140),
    st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.:\-]{0,127}", fullmatch=True),
)


# -- registration ---------------------------------------------------------------------------------


def test_register_returns_the_kind_and_both_lookups_find_it() -> None:
    jobs = Jobs()
    kind = jobs.register("send_invoice", SendInvoice, handle_invoice, queue="billing", priority=-5)
    assert kind.name == "send_invoice"
    assert kind.model is SendInvoice
    assert kind.handler is handle_invoice
    assert kind.options == KindOptions(queue="billing", priority=-5)
    assert jobs.by_name("send_invoice") is kind
    assert jobs.by_model(SendInvoice) is kind
    assert jobs.kind_named("send_invoice") is kind
    assert list(jobs) == [kind]
    assert len(jobs) == 1


def test_register_without_handler_is_allowed_for_enqueue_only_processes() -> None:
    jobs = Jobs()
    kind = jobs.register("resize", ResizeImage)
    assert kind.handler is None
    assert kind.options == KindOptions()


def test_kind_decorator_registers_the_function_and_returns_it_unchanged() -> None:
    jobs = Jobs()

    @jobs.kind("send_invoice", SendInvoice, max_attempts=3, timeout=30)
    def send(payload: SendInvoice, ctx: object) -> None:
        """Send it."""

    assert send.__name__ == "send"
    assert send.__doc__ == "Send it."
    kind = jobs.by_name("send_invoice")
    assert kind.handler is send
    assert kind.options.max_attempts == 3
    assert kind.options.timeout == 30


def test_the_plain_registry_supports_the_decorator_too() -> None:
    registry = Registry()
    decorated = registry.kind("send_invoice", SendInvoice)(handle_invoice)
    assert decorated is handle_invoice
    assert registry.by_model(SendInvoice).handler is handle_invoice


def test_kind_options_default_to_the_documented_values() -> None:
    opts = Jobs().register("send_invoice", SendInvoice).options
    assert (opts.queue, opts.priority, opts.max_attempts, opts.max_crashes) == ("default", 0, 10, 3)
    assert opts.backoff == Backoff()
    assert opts.timeout is None


def test_registering_the_same_kind_twice_is_refused_and_keeps_the_first() -> None:
    jobs = Jobs()
    first = jobs.register("send_invoice", SendInvoice)
    with pytest.raises(RegistryError, match="send_invoice"):
        jobs.register("send_invoice", ResizeImage)
    assert jobs.by_name("send_invoice") is first
    with pytest.raises(UnknownKindError):
        jobs.by_model(ResizeImage)


def test_registering_the_same_kind_twice_through_the_decorator_is_refused() -> None:
    jobs = Jobs()
    jobs.kind("send_invoice", SendInvoice)(handle_invoice)
    with pytest.raises(RegistryError):
        jobs.kind("send_invoice", ResizeImage)(handle_invoice)


def test_one_model_under_two_kinds_is_refused_and_names_the_existing_kind() -> None:
    jobs = Jobs()
    jobs.register("send_invoice", SendInvoice)
    with pytest.raises(RegistryError, match="'send_invoice'"):
        jobs.register("send_invoice_v2", SendInvoice)
    assert jobs.kind_named("send_invoice_v2") is None
    assert len(jobs) == 1


def test_separate_registries_are_independent() -> None:
    a, b = Jobs(), Jobs()
    a.register("send_invoice", SendInvoice)
    b.register("send_invoice", SendInvoice)
    with pytest.raises(UnknownKindError):
        Jobs().by_model(SendInvoice)


@pytest.mark.parametrize("model", [dict, int, "SendInvoice", SendInvoice(invoice_id=1), None])
def test_a_payload_model_that_is_not_a_pydantic_model_class_is_refused(model: Any) -> None:
    with pytest.raises(RegistryError):
        Jobs().register("send_invoice", model)


def test_unknown_option_is_refused_with_a_registry_error() -> None:
    with pytest.raises(RegistryError, match="retries"):
        Jobs().register("send_invoice", SendInvoice, retries=3)


def test_queues_lists_the_distinct_default_queues_sorted() -> None:
    jobs = Jobs()
    jobs.register("a", SendInvoice, queue="mail")
    jobs.register("b", ResizeImage, queue="images")

    class Other(BaseModel):
        pass

    jobs.register("c", Other, queue="mail")
    assert jobs.queues() == ["images", "mail"]


# -- lookups --------------------------------------------------------------------------------------


def test_by_name_of_an_unknown_kind_raises_unknown_kind_error_naming_it() -> None:
    jobs = Jobs()
    jobs.register("send_invoice", SendInvoice)
    with pytest.raises(UnknownKindError, match="'send_nvoice'"):
        jobs.by_name("send_nvoice")
    assert jobs.kind_named("send_nvoice") is None


def test_by_model_of_an_unregistered_model_raises_unknown_kind_error_naming_it() -> None:
    with pytest.raises(UnknownKindError, match="ResizeImage"):
        Jobs().by_model(ResizeImage)


def test_by_model_does_not_resolve_a_subclass_of_a_registered_model() -> None:
    class SendInvoiceLater(SendInvoice):
        pass

    jobs = Jobs()
    jobs.register("send_invoice", SendInvoice)
    with pytest.raises(UnknownKindError):
        jobs.by_model(SendInvoiceLater)


def test_unknown_kind_error_is_an_enqueue_error_and_registry_error_a_sqla_jobs_error() -> None:
    assert issubclass(UnknownKindError, EnqueueError)
    assert issubclass(EnqueueError, SqlaJobsError)
    assert issubclass(RegistryError, SqlaJobsError)


# -- the kind string, not the class, is the identity ----------------------------------------------


def test_renaming_the_class_does_not_change_the_kind() -> None:
    class Invoice(BaseModel):
        invoice_id: int

    jobs = Jobs()
    jobs.register("send_invoice", Invoice)
    Invoice.__name__ = Invoice.__qualname__ = "RenamedInvoice"
    assert jobs.by_model(Invoice).name == "send_invoice"
    assert jobs.by_name("send_invoice").model is Invoice


def test_a_renamed_class_in_new_code_resolves_jobs_written_by_the_old_class() -> None:
    class OldName(BaseModel):
        invoice_id: int

    class NewName(BaseModel):
        invoice_id: int

    old, new = Jobs(), Jobs()
    old.register("send_invoice", OldName)
    new.register("send_invoice", NewName)
    stored_kind = old.by_model(OldName).name
    stored_json = OldName(invoice_id=7).model_dump_json()
    assert stored_kind == "send_invoice"
    assert new.by_name(stored_kind).model.model_validate_json(stored_json) == NewName(invoice_id=7)


# -- names ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", UNSAFE_NAMES)
def test_an_unsafe_kind_name_is_refused(name: str) -> None:
    jobs = Jobs()
    with pytest.raises(RegistryError, match="invalid kind name"):
        jobs.register(name, SendInvoice)
    assert len(jobs) == 0


@pytest.mark.parametrize("name", SAFE_NAMES)
def test_a_safe_kind_name_is_accepted(name: str) -> None:
    assert Jobs().register(name, SendInvoice).name == name


@pytest.mark.parametrize("name", [*UNSAFE_NAMES, 7, None])
def test_an_unsafe_default_queue_is_refused_at_registration(name: Any) -> None:
    with pytest.raises(RegistryError, match="invalid queue name"):
        Jobs().register("send_invoice", SendInvoice, queue=name)


@given(names)
def test_a_kind_name_is_accepted_exactly_when_it_is_safe(name: str) -> None:
    jobs = Jobs()
    if is_safe_name(name):
        assert jobs.register(name, SendInvoice).name == name
    else:
        with pytest.raises(RegistryError):
            jobs.register(name, SendInvoice)
        assert len(jobs) == 0


@given(names)
def test_a_default_queue_is_accepted_exactly_when_it_is_safe(name: str) -> None:
    jobs = Jobs()
    if is_safe_name(name):
        assert jobs.register("k", SendInvoice, queue=name).options.queue == name
    else:
        with pytest.raises(RegistryError):
            jobs.register("k", SendInvoice, queue=name)


@given(names)
def test_an_unsafe_queue_at_enqueue_is_refused_before_any_sql_runs(name: str) -> None:
    jobs = Jobs()
    jobs.register("send_invoice", SendInvoice)
    # An unbound Session fails at its first statement: a name that passes the checks gets that far,
    # one that does not is refused before.
    with Session() as session:
        if is_safe_name(name):
            with pytest.raises(UnboundExecutionError):
                jobs.enqueue(session, SendInvoice(invoice_id=1), queue=name)
        else:
            with pytest.raises(InvalidQueueNameError):
                jobs.enqueue(session, SendInvoice(invoice_id=1), queue=name)


@pytest.mark.parametrize("schema", [*UNSAFE_NAMES, 7])
def test_an_unsafe_schema_is_refused_with_a_configuration_error(schema: Any) -> None:
    with pytest.raises(ConfigurationError):
        Jobs(schema=schema)


def test_the_notify_channel_carries_the_schema() -> None:
    assert Jobs().channel == "sqla_jobs"
    assert Jobs(schema="tenant_1").channel == "sqla_jobs.tenant_1"


@pytest.mark.parametrize("limit", [1, 0, -1])
def test_a_payload_limit_below_the_empty_object_is_refused(limit: int) -> None:
    with pytest.raises(ConfigurationError):
        Jobs(max_payload_bytes=limit)


# -- options --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "options",
    [
        {"priority": -32769},
        {"priority": 32768},
        {"priority": 2**40},
        {"max_attempts": 0},
        {"max_attempts": -1},
        {"max_crashes": 0},
        {"timeout": 0},
        {"timeout": 0.0},
        {"timeout": -1},
        {"timeout": -math.inf},
        {"queue": ""},
        {"queue": "a b"},
        {"priority": 1.5},
        {"max_attempts": 2**31},
        {"max_crashes": 2**31},
        {"timeout": math.nan},
    ],
    ids=repr,
)
def test_options_that_cannot_work_are_refused(options: dict[str, Any]) -> None:
    jobs = Jobs()
    with pytest.raises(RegistryError):
        jobs.register("send_invoice", SendInvoice, **options)
    assert len(jobs) == 0


@pytest.mark.parametrize(
    "options",
    [
        {"priority": -32768},
        {"priority": 32767},
        {"max_attempts": 1},
        {"max_crashes": 1},
        {"timeout": 0.001},
        {"timeout": None},
        {"queue": "a" * 128},
        {"backoff": Backoff(base=3, cap_seconds=60, jitter=0.5)},
    ],
    ids=repr,
)
def test_options_at_their_bounds_are_accepted(options: dict[str, Any]) -> None:
    kind = Jobs().register("send_invoice", SendInvoice, **options)
    assert kind.options == KindOptions(**options)


def test_a_refused_registration_leaves_the_name_and_model_free() -> None:
    jobs = Jobs()
    with pytest.raises(RegistryError):
        jobs.register("send_invoice", SendInvoice, max_attempts=0)
    assert jobs.register("send_invoice", SendInvoice).name == "send_invoice"
