"""`@app.task` returns a typed Task: callable like the function, resolvable wherever a task is
accepted; `task.enqueue(*args, key=, at=, delay=, queue=, **kwargs)` takes the function's
arguments unwrapped plus the enqueue options, and `task.options(...).enqueue(...)` takes the
function's arguments only (a task with parameters named key, at, delay or queue)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

import duetime
from tests.apps import basic
from tests.integration.inproc import burst


@pytest.fixture
def tapp(url: str, namespace: str):
    app = duetime.App(redis_url=url, namespace=namespace)

    @app.task(name="keyed", retries=1, owner="team-a")
    def keyed(order: int, key: str = "", *, at: str = "", delay: float = 0.0, queue: str = "") -> str:
        """Has parameters named like every enqueue option."""
        return f"{order}:{key}:{at}:{delay}:{queue}"

    @app.task
    def bare(x: int) -> int:
        return x * 2

    app.test_tasks = (keyed, bare)  # type: ignore[attr-defined]
    yield app
    app.close()


def test_the_task_object_is_the_function_plus_its_spec(tapp):
    keyed, bare = tapp.test_tasks
    assert isinstance(keyed, duetime.Task) and isinstance(bare, duetime.Task)
    assert keyed(3, "k", queue="q") == "3:k::0.0:q"  # called directly: runs here, as before
    assert bare(21) == 42
    assert keyed.__name__ == "keyed" and keyed.__doc__.startswith("Has parameters")
    assert keyed.__wrapped__.__name__ == "keyed"
    assert (keyed.name, keyed.queue, keyed.retries, keyed.owner) == ("keyed", "default", 1, "team-a")
    assert bare.name == f"{__name__}.tapp.<locals>.bare"  # module.qualname by default
    assert tapp.registry.get("keyed") is keyed.spec
    assert tapp.registry.resolve(keyed) is keyed.spec
    assert tapp.registry.resolve(keyed.__wrapped__) is keyed.spec  # the raw function too
    assert isinstance(keyed.spec, duetime.TaskSpec)


def test_enqueue_takes_unwrapped_arguments_and_the_enqueue_options(tapp):
    _, bare = tapp.test_tasks
    first = bare.enqueue(7, key="order-7", delay=60, queue="other")
    assert bare.enqueue(7, key="order-7") == first  # the idempotency key: the same run
    run = tapp.get_run(first)
    assert (run.args, run.kwargs, run.key, run.queue) == ([7], {}, "order-7", "other")
    assert timedelta(seconds=59) < run.due - run.created < timedelta(seconds=61)
    run = tapp.get_run(bare.enqueue(x=8))
    assert (run.args, run.kwargs) == ([], {"x": 8})


def test_arguments_that_do_not_fit_the_signature_fail_at_the_call_site(tapp):
    keyed, bare = tapp.test_tasks
    for call in (lambda: bare.enqueue(), lambda: bare.enqueue(1, 2), lambda: bare.enqueue(y=1),
                 lambda: tapp.enqueue(bare, [1, 2]), lambda: tapp.enqueue_many([(bare, [])])):
        with pytest.raises(duetime.InvalidInput, match="cannot take these arguments"):
            call()
    assert tapp.enqueue(keyed, [1], {"queue": "q"})  # a kwarg the function has


def test_options_pass_parameters_named_like_options_to_the_function(tapp):
    keyed, _ = tapp.test_tasks
    run_id = keyed.options().enqueue(7, key="mine", at="noon", delay=3.5, queue="q")
    run = tapp.get_run(run_id)
    assert (run.task, run.args, run.state) == ("keyed", [7], "scheduled")
    assert run.kwargs == {"key": "mine", "at": "noon", "delay": 3.5, "queue": "q"}
    assert run.key is None and run.queue == "default"  # none of them was taken as an option
    assert run.due is not None and run.created is not None
    assert run.due - run.created < timedelta(seconds=1)  # not delayed
    assert run.owner == "team-a" and run.max_attempts == 2


def test_options_bind_key_delay_at_and_queue(tapp):
    keyed, _ = tapp.test_tasks
    later = keyed.options(key="order-7", queue="other", delay=60)
    first = later.enqueue(7, key="mine")
    assert later.enqueue(7, key="mine") == first  # the idempotency key: the same run
    run = tapp.get_run(first)
    assert (run.key, run.queue, run.args, run.kwargs) == ("order-7", "other", [7], {"key": "mine"})
    assert timedelta(seconds=59) < run.due - run.created < timedelta(seconds=61)

    when = datetime.now(UTC) + timedelta(hours=1)
    run = tapp.get_run(keyed.options(at=when).enqueue(8))
    assert abs(run.due - when) < timedelta(milliseconds=2)
    with pytest.raises(duetime.InvalidInput):
        keyed.options(at=when, delay=5).enqueue(9)


def test_a_task_object_works_where_tasks_were_accepted_before(tapp):
    keyed, bare = tapp.test_tasks
    one = tapp.enqueue(bare, [1])
    two, three = tapp.enqueue_many([(bare, [2]), {"task": keyed, "args": [3]}])
    assert [tapp.get_run(i).task for i in (one, two, three)] == [bare.name, bare.name, "keyed"]
    assert tapp.schedule_def("s", duetime.Every(timedelta(minutes=1)), keyed, [4]).task == "keyed"


def test_a_run_enqueued_through_the_task_object_runs(app):
    run_id = basic.noop.enqueue(5)
    burst(app)
    assert app.get_run(run_id).state == "succeeded"
    assert app.get_run(run_id).args == [5]
