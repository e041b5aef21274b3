"""`App.aenqueue` takes `App.enqueue`'s parameters from one list (duetime/app.py
`_async_twin`): the same signature for `help()` and type checkers, and the same refusal of a
misspelled option, before any I/O."""

from __future__ import annotations

import asyncio
import inspect

import pytest

from duetime import App


def test_aenqueue_has_the_parameters_of_enqueue():
    app = App()
    assert inspect.signature(app.aenqueue) == inspect.signature(app.enqueue)
    assert list(inspect.signature(app.aenqueue).parameters)[:3] == ["task", "args", "kwargs"]


def test_a_misspelled_option_is_refused_as_enqueue_refuses_it():
    app = App()  # no server: the refusal comes before any connection
    with pytest.raises(TypeError, match="dely"):
        asyncio.run(app.aenqueue("send-invoice", [1], dely="30s"))
    with pytest.raises(TypeError, match="dely"):
        app.enqueue("send-invoice", [1], dely="30s")  # type: ignore[call-arg]
