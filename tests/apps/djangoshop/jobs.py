"""The Django app's tasks and schedules."""

from __future__ import annotations

from datetime import timedelta

import duetime

app = duetime.App()


@app.task(name="shop.confirm")
def confirm(order_id: int) -> None:
    from tests.apps.djangoshop.models import Order

    Order.objects.get(pk=order_id)  # the run starts only once the order is committed


def declare_schedules() -> dict[str, str]:
    """Every schedule of the app, declared again at each deploy (unchanged ones stay as they are)."""
    return {"shop.nightly-confirm": app.schedule("shop.nightly-confirm",
                                                 duetime.Cron("30 2 * * *", tz="Europe/Paris"),
                                                 confirm, [0]),
            "shop.poll": app.schedule("shop.poll", duetime.Every(timedelta(minutes=15)), confirm, [0])}
