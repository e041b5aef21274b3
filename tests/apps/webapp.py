"""The web console's test application: a task that fails until a test says its bug is fixed
(so a dead letter's replay can succeed), a slow one, a gated one (a backlog held part-drained
until the test opens the gate), a non-idempotent one and one for schedules."""

from __future__ import annotations

import asyncio
import time

import duetime
from tests.apps import OwnClient

app = duetime.App()
r = OwnClient(app)  # the tasks' own client: r()


def fixed_key() -> str:
    return f"{app.keys.namespace}:test:fixed"


@app.task(name="web.charge", retries=0, owner="payments")
def charge(invoice: int) -> None:
    if not r().exists(fixed_key()):
        raise duetime.Fatal(f"card processor rejected invoice {invoice}")


@app.task(name="web.slow")
async def slow(seconds: float) -> None:
    await asyncio.sleep(seconds)


def gate_key() -> str:
    return f"{app.keys.namespace}:test:gate"


@app.task(name="web.gated")
async def gated() -> None:
    """Runs until the test opens the gate (sets gate_key()): a backlog that stays part-drained,
    with leases held, for as long as the test looks at it, whatever the machine's speed."""
    while not r().exists(gate_key()):
        await asyncio.sleep(0.02)


@app.task(name="web.transfer", idempotent=False, owner="treasury")
def transfer(amount: int, seconds: float = 0.0) -> None:
    time.sleep(seconds)


@app.task(name="web.tick")
def tick() -> None:
    pass
