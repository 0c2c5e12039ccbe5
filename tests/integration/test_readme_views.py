"""The README's views answer as a project copying them should: a 404 for an id no instance has."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from django.http import Http404
from django.test import RequestFactory

import selvedge_django as sv
from tests.conftest import ROOT


def _readme_views() -> dict[str, Any]:
    """The README's ``greetings/views.py``, run as a module (its workflow left out)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)
    [source] = [block for block in blocks if "def result(request" in block]
    source = source.replace("from .workflows import greet", "greet = None")
    namespace: dict[str, Any] = {"__name__": "greetings.views"}
    exec(compile(source, "README.md", "exec"), namespace)
    return namespace


def test_the_result_view_answers_404_for_an_unknown_id(tdb: None) -> None:
    result = _readme_views()["result"]
    request = RequestFactory().get("/result/nobody/")
    for unknown in ("never-started", "x" * 5000, "nul\x00id"):
        with pytest.raises(Http404):
            result(request, unknown)


def test_the_result_view_answers_a_known_id(tdb: None) -> None:
    instance_id = sv.start_workflow("test.sum3", {"a": 1, "b": 2, "c": 3})
    response = _readme_views()["result"](RequestFactory().get("/"), instance_id)
    assert response.status_code == 200
    assert json.loads(response.content)["status"] == "running"
