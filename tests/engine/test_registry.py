"""Registering workflows and activities under durable names."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import selvedge_django as sv
from selvedge_django import registry


@pytest.fixture
def throwaway() -> Iterator[list[tuple[str, str]]]:
    """Names registered by a test; unregistered afterwards."""
    names: list[tuple[str, str]] = []
    yield names
    for kind, name in names:
        registry.unregister(name, kind=kind)


def test_activity_name_taken_by_another_function_conflicts(throwaway: list[Any]) -> None:
    throwaway.append(("activity", "registry_test.charge"))

    @sv.activity(name="registry_test.charge")
    def charge(amount: int) -> int:
        return amount

    with pytest.raises(sv.ActivityNameConflict, match=r"registry_test\.charge"):

        @sv.activity(name="registry_test.charge")
        def charge_twice(amount: int) -> int:
            return amount * 2

    # The first registration is still the one dispatched by name.
    assert registry.get_activity("registry_test.charge") is charge
    assert charge(21) == 21


def test_workflow_name_taken_by_another_function_conflicts(throwaway: list[Any]) -> None:
    throwaway.append(("workflow", "registry_test.order"))

    @sv.workflow(name="registry_test.order")
    def order(ctx: sv.WorkflowContext, data: Any) -> Any:
        return data

    with pytest.raises(sv.WorkflowNameConflict, match=r"registry_test\.order"):

        @sv.workflow(name="registry_test.order")
        def another_order(ctx: sv.WorkflowContext, data: Any) -> Any:
            return None

    assert registry.get_workflow("registry_test.order") is order


def test_conflicts_are_selvedge_errors() -> None:
    assert issubclass(sv.ActivityNameConflict, sv.SelvedgeError)
    assert issubclass(sv.WorkflowNameConflict, sv.SelvedgeError)


def test_registering_the_same_function_again_is_fine(throwaway: list[Any]) -> None:
    throwaway.extend([("activity", "registry_test.same"), ("workflow", "registry_test.same")])

    def body(x: Any) -> Any:
        return x

    def flow(ctx: sv.WorkflowContext, x: Any) -> Any:
        return x

    sv.activity(name="registry_test.same")(body)
    sv.activity(name="registry_test.same")(body)
    found = registry.get_activity("registry_test.same")
    assert found is not None and found.fn is body

    sv.workflow(name="registry_test.same")(flow)
    again = sv.workflow(name="registry_test.same")(flow)
    assert registry.get_workflow("registry_test.same") is again


def test_activity_and_workflow_names_are_separate(throwaway: list[Any]) -> None:
    throwaway.extend([("activity", "registry_test.shared"), ("workflow", "registry_test.shared")])

    @sv.activity(name="registry_test.shared")
    def act(x: Any) -> Any:
        return x

    @sv.workflow(name="registry_test.shared")
    def flow(ctx: sv.WorkflowContext, x: Any) -> Any:
        return x

    assert registry.get_activity("registry_test.shared") is act
    assert registry.get_workflow("registry_test.shared") is flow


def test_unregister_frees_the_name(throwaway: list[Any]) -> None:
    throwaway.append(("activity", "registry_test.freed"))

    @sv.activity(name="registry_test.freed")
    def first(x: Any) -> Any:
        return x

    assert "registry_test.freed" in registry.registered_activity_names()
    registry.unregister("registry_test.freed", kind="activity")
    assert registry.get_activity("registry_test.freed") is None
    assert "registry_test.freed" not in registry.registered_activity_names()

    @sv.activity(name="registry_test.freed")
    def second(x: Any) -> Any:
        return x

    assert registry.get_activity("registry_test.freed") is second


def test_a_name_is_required() -> None:
    before = (registry.registered_activity_names(), registry.registered_workflow_names())

    with pytest.raises(TypeError, match="name"):

        @sv.activity  # type: ignore[call-overload]
        def bare_activity(x: Any) -> Any:
            return x

    with pytest.raises(TypeError, match="name"):
        sv.activity()  # type: ignore[call-overload]

    with pytest.raises(TypeError, match="name"):

        @sv.workflow  # type: ignore[arg-type]
        def bare_workflow(ctx: sv.WorkflowContext, x: Any) -> Any:
            return x

    with pytest.raises(TypeError, match="name"):
        sv.workflow()

    assert (registry.registered_activity_names(), registry.registered_workflow_names()) == before


@pytest.mark.parametrize("name", ["", "   ", "n" * 256, 42])
def test_invalid_names_are_rejected(name: Any) -> None:
    with pytest.raises(ValueError):
        sv.activity(name=name)
    with pytest.raises(ValueError):
        sv.workflow(name=name)


def test_definition_records_decorator_defaults(throwaway: list[Any]) -> None:
    throwaway.append(("activity", "registry_test.defaults"))
    policy = sv.RetryPolicy(max_attempts=2, non_retryable_errors=[KeyError])

    @sv.activity(
        name="registry_test.defaults",
        queue="billing",
        start_to_close_timeout=30,
        retry_policy=policy,
        transactional=True,
    )
    def charge(x: Any) -> Any:
        """Charge a card."""
        return x

    assert isinstance(charge, sv.ActivityDefinition)
    assert charge.name == "registry_test.defaults"
    assert charge.options == sv.ActivityOptions(
        queue="billing", start_to_close_timeout=30, retry_policy=policy
    )
    assert charge.transactional is True
    assert charge.non_retryable_errors == (KeyError,)
    assert charge.__doc__ == "Charge a card."


def test_invalid_decorator_options_are_rejected_at_definition(throwaway: list[Any]) -> None:
    with pytest.raises(ValueError):
        sv.activity(name="registry_test.bad_timeout", start_to_close_timeout=0)
    with pytest.raises(TypeError):
        sv.activity(name="registry_test.bad_policy", retry_policy={"max_attempts": 1})  # type: ignore[arg-type]
    assert registry.get_activity("registry_test.bad_timeout") is None
    assert registry.get_activity("registry_test.bad_policy") is None


def test_a_workflow_cannot_be_called_outside_a_worker(throwaway: list[Any]) -> None:
    throwaway.append(("workflow", "registry_test.direct"))

    @sv.workflow(name="registry_test.direct")
    def flow(ctx: sv.WorkflowContext, x: Any) -> Any:
        return x

    with pytest.raises(RuntimeError, match="start_workflow"):
        flow(None, 1)  # type: ignore[arg-type]


def test_execute_needs_a_workflow_context(throwaway: list[Any]) -> None:
    throwaway.append(("activity", "registry_test.ctx"))

    @sv.activity(name="registry_test.ctx")
    def act(x: Any) -> Any:
        return x

    with pytest.raises(TypeError, match="ctx"):
        act.execute(None, 1)  # type: ignore[arg-type]
