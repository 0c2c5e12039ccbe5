"""Typed payloads: SELVEDGE["PAYLOAD_CONVERTER"] = "selvedge_django.converters.TypedConverter".

Values are stored as the same JSON as before; on the way back into workflow and
activity code (and into ``get_workflow_result``) they are rebuilt by the
functions' annotations. Without the setting everything stays JSON, and the
checked-in JSON histories replay the same with the typed converter as without.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import json
import typing
import uuid
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pydantic
import pytest
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

import selvedge_django as sv
from selvedge_django.conf import get_settings
from selvedge_django.converters import TypedConverter
from selvedge_django.models import ActivityTask, HistoryEvent, WorkflowInstance
from selvedge_django.testing import run_until_idle
from selvedge_django.worker import Worker
from tests import ops_workflows

# ops.golden.order, the code the checked-in histories were recorded from.
assert ops_workflows.order.name == "ops.golden.order"

TYPED = "selvedge_django.converters.TypedConverter"
HISTORIES = Path(__file__).resolve().parents[1] / "histories"


class Size(enum.Enum):
    SMALL = "s"
    LARGE = "l"


@dataclasses.dataclass(frozen=True)
class Line:
    sku: str
    price: Decimal
    quantity: int
    size: Size = Size.SMALL


@dataclasses.dataclass(frozen=True)
class Order:
    order_id: uuid.UUID
    placed_on: dt.date
    lines: list[Line]
    note: str | None = None


class Receipt(pydantic.BaseModel):
    order_id: uuid.UUID
    total: Decimal
    issued_at: dt.datetime
    skus: tuple[str, ...]


@sv.activity(name="typed.total")
def total(order: Order) -> Decimal:
    assert isinstance(order, Order) and isinstance(order.order_id, uuid.UUID)
    assert all(isinstance(line, Line) and isinstance(line.price, Decimal) for line in order.lines)
    assert all(isinstance(line.size, Size) for line in order.lines)
    return sum((line.price * line.quantity for line in order.lines), Decimal("0"))


@sv.activity(name="typed.issue")
def issue(receipt: Receipt) -> Receipt:
    assert isinstance(receipt, Receipt) and isinstance(receipt.total, Decimal)
    return receipt.model_copy(update={"skus": (*receipt.skus, "stamp")})


@sv.activity(name="typed.days")
def days(dates: dict[str, dt.date]) -> list[dt.date]:
    assert all(isinstance(d, dt.date) for d in dates.values())
    return sorted(dates.values())


@sv.workflow(name="typed.checkout")
def checkout(ctx: sv.WorkflowContext, order: Order) -> Receipt:
    assert isinstance(order, Order) and isinstance(order.placed_on, dt.date)
    amount = total.execute(ctx, order)
    assert isinstance(amount, Decimal), type(amount)
    first, last = days.execute(ctx, {"placed": order.placed_on, "due": dt.date(2030, 1, 31)})
    assert isinstance(first, dt.date) and first <= last
    receipt = issue.execute(
        ctx,
        Receipt(
            order_id=order.order_id,
            total=amount,
            issued_at=dt.datetime(2026, 12, 2, 13, 0, 0, 123456, tzinfo=dt.UTC),
            skus=tuple(line.sku for line in order.lines),
        ),
    )
    assert isinstance(receipt, Receipt)
    return receipt


@sv.workflow(name="typed.parent")
def parent(ctx: sv.WorkflowContext, order: Order) -> list[str]:
    receipt = ctx.start_child(checkout, order).get(ctx)
    assert isinstance(receipt, Receipt), type(receipt)
    return [str(receipt.total), receipt.skus[-1]]


ORDER = Order(
    order_id=uuid.UUID("12345678-1234-5678-1234-567812345678"),
    placed_on=dt.date(2026, 12, 2),
    lines=[Line("tea", Decimal("3.10"), 3), Line("mug", Decimal("12.50"), 1, Size.LARGE)],
)


@pytest.fixture
def typed(tdb: None) -> Iterator[None]:
    with override_settings(SELVEDGE={**settings.SELVEDGE, "PAYLOAD_CONVERTER": TYPED}):
        yield


def test_dataclasses_models_decimals_dates_and_uuids_come_back_as_they_went_in(
    typed: None,
) -> None:
    iid = sv.start_workflow(checkout, ORDER)
    run_until_idle(Worker())
    result = sv.get_workflow_result(iid)
    assert result.status == "completed", result.error
    receipt = result.output
    assert isinstance(receipt, Receipt)
    assert receipt.total == Decimal("21.80") and isinstance(receipt.total, Decimal)
    assert receipt.order_id == ORDER.order_id
    assert receipt.issued_at == dt.datetime(2026, 12, 2, 13, 0, 0, 123456, tzinfo=dt.UTC)
    assert receipt.skus == ("tea", "mug", "stamp")
    assert sv.wait_workflow(iid, timeout=5).output == receipt

    # Stored as plain JSON: strings for the Decimal, the date and the UUID.
    stored = WorkflowInstance.objects.get(pk=iid)
    assert stored.input == {
        "order_id": "12345678-1234-5678-1234-567812345678",
        "placed_on": "2026-12-02",
        "lines": [
            {"sku": "tea", "price": "3.10", "quantity": 3, "size": "s"},
            {"sku": "mug", "price": "12.50", "quantity": 1, "size": "l"},
        ],
        "note": None,
    }
    task = ActivityTask.objects.get(instance_id=iid, name="typed.total")
    assert json.loads(task.input)["lines"][0]["price"] == "3.10"
    totals = HistoryEvent.objects.get(instance_id=iid, key=task.key)
    assert json.loads(totals.data) == "21.80"
    # A replay check with the converter decodes the same way.
    sv.replay_instance(iid)


def test_a_childs_result_is_typed_by_the_child_definition(typed: None) -> None:
    iid = sv.start_workflow(parent, ORDER)
    run_until_idle(Worker())
    assert sv.get_workflow_result(iid).output == ["21.80", "stamp"]


def test_without_the_setting_values_stay_json(tdb: None) -> None:
    assert get_settings().payload_converter is None
    iid = sv.start_workflow(
        "typed.days.flow", {"when": dt.date(2026, 12, 2), "id": uuid.UUID(int=1)}
    )
    run_until_idle(Worker())
    assert sv.get_workflow_result(iid).output == {
        "when": "2026-12-02",
        "id": "00000000-0000-0000-0000-000000000001",
    }


@sv.workflow(name="typed.days.flow")
def days_flow(ctx: sv.WorkflowContext, value: dict[str, dt.date]) -> Any:
    return value


def test_a_value_that_does_not_fit_its_annotation_fails_the_run_with_a_typed_error(
    typed: None,
) -> None:
    iid = sv.start_workflow("typed.checkout", {"order_id": "not a uuid", "placed_on": "x"})
    run_until_idle(Worker())
    result = sv.get_workflow_result(iid)
    assert result.status == "failed"
    assert "cannot read" in str(result.error) and "Order" in str(result.error)


@pytest.mark.parametrize(
    "name",
    [
        "order_completed.json",
        "order_completed_reformatted.json",
        "order_running.json",
        "order_failed.json",
        "order_cancelled.json",
    ],
)
def test_checked_in_json_histories_replay_unchanged_with_the_typed_converter(
    typed: None, name: str
) -> None:
    history = sv.parse_history((HISTORIES / name).read_text())
    sv.replay_history(history)


def test_the_converter_round_trips_values_by_annotation() -> None:
    converter = TypedConverter()

    def roundtrip(value: Any, annotation: Any) -> Any:
        text = json.dumps(value, cls=converter.encoder)
        return converter.from_json(json.loads(text), annotation)

    moment = dt.datetime(2026, 12, 2, 13, 0, 0, 654321, tzinfo=dt.UTC)
    cases: list[tuple[Any, Any]] = [
        (Decimal("0.10"), Decimal),
        (dt.date(2026, 2, 28), dt.date),
        (moment, dt.datetime),
        (dt.time(9, 30, 0, 5), dt.time),
        (dt.timedelta(days=1, seconds=5), dt.timedelta),
        (uuid.UUID(int=7), uuid.UUID),
        (Size.LARGE, Size),
        (ORDER, Order),
        ([Decimal("1"), None], list[Decimal | None]),
        ({1: dt.date(2026, 1, 1)}, dict[int, dt.date]),
        ({uuid.UUID(int=3)}, set[uuid.UUID]),
        ((Decimal("1.5"), "x"), tuple[Decimal, str]),
        (None, Order | None),
    ]
    for value, annotation in cases:
        back = roundtrip(value, annotation)
        assert back == value and type(back) is type(value), (value, back)


class Rank(enum.IntEnum):
    FIRST = 1


LINE = {"sku": "tea", "price": "3.10", "quantity": 3, "size": "s"}


@pytest.mark.parametrize(
    ("value", "annotation"),
    [
        ("one", int),
        (5, str),
        ("yes", bool),
        (1, bool),
        (True, int),  # bool is not int
        (1.5, int),
        (5.0, int),
        ("1.5", float),
        (True, float),
        (5, dict),
        ("x", list),
        ([1], dict),
        ([1, "two"], list[int]),
        ({"a": "x"}, dict[str, int]),
        ({"x": 1}, dict[int, int]),
        ({"1.0": 1}, dict[int, int]),
        (["a"], tuple[int, ...]),
        ([1, 2], tuple[int, str]),
        (["yes"], set[bool]),
        ({**LINE, "sku": 5}, Line),
        ({**LINE, "quantity": "3"}, Line),
        ([{**LINE, "quantity": True}], list[Line]),
        ({"lines": [{**LINE, "quantity": "3"}]}, dict[str, list[Line]]),
        ("c", typing.Literal["a", "b"]),
        (True, typing.Literal[1]),
        ("x", int | None),
        (1, dt.date | None),
        (True, Rank),  # an IntEnum: a boolean is not its 1
    ],
)
def test_a_value_of_the_wrong_json_type_raises_payload_conversion_error(
    value: Any, annotation: Any
) -> None:
    with pytest.raises(sv.PayloadConversionError, match="cannot read"):
        TypedConverter().from_json(value, annotation)


@pytest.mark.parametrize(
    ("value", "annotation", "expected"),
    [
        (5, int, 5),
        (5, float, 5.0),  # a JSON number without a fraction is a float too
        (2.5, float, 2.5),
        (True, bool, True),
        ("x", str, "x"),
        ("5", int | str, "5"),
        (5, int | str, 5),
        (5, float | int, 5),  # the member of the value's own type first
        (5, float | None, 5.0),
        (None, int | None, None),
        ({"a": 1}, dict, {"a": 1}),
        ([1, "a"], list, [1, "a"]),
        ({"1": "a", "-2": "b"}, dict[int, str], {1: "a", -2: "b"}),
        ({"true": 1, "false": 0}, dict[bool, int], {True: 1, False: 0}),
        ({"1.5": 1}, dict[float, int], {1.5: 1}),
        ("a", typing.Literal["a", "b"], "a"),
        ([1, 2.5], list[float], [1.0, 2.5]),
        (1, Rank, Rank.FIRST),
    ],
)
def test_values_of_the_right_json_type_are_accepted(
    value: Any, annotation: Any, expected: Any
) -> None:
    back = TypedConverter().from_json(value, annotation)
    assert back == expected and type(back) is type(expected)
    if isinstance(expected, list | dict):
        assert [type(v) for v in back] == [type(v) for v in expected]


def test_a_wrongly_typed_field_fails_the_run_with_a_typed_error(typed: None) -> None:
    order = {
        "order_id": str(ORDER.order_id),
        "placed_on": "2026-12-02",
        "lines": [{**LINE, "quantity": "3"}],
    }
    iid = sv.start_workflow("typed.checkout", order)
    run_until_idle(Worker())
    result = sv.get_workflow_result(iid)
    assert result.status == "failed"
    assert "PayloadConversionError" in str(result.error.type if result.error else "")
    assert "cannot read" in str(result.error) and "int" in str(result.error)


def test_a_bad_converter_setting_is_refused(tdb: None) -> None:
    with (
        override_settings(SELVEDGE={**settings.SELVEDGE, "PAYLOAD_CONVERTER": "json.dumps"}),
        pytest.raises(ImproperlyConfigured, match="PAYLOAD_CONVERTER"),
    ):
        get_settings()
