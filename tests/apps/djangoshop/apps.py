from __future__ import annotations

from django.apps import AppConfig
from django.conf import settings


class ShopConfig(AppConfig):
    name = "tests.apps.djangoshop"
    label = "djangoshop"

    def ready(self) -> None:
        # point the duetime app at the server the settings name; nothing is written to Redis
        # here (ready() runs in every process, migrations included): schedules are declared by
        # `manage.py declare_schedules`, run once per deploy
        from tests.apps.djangoshop.jobs import app

        app.configure(redis_url=getattr(settings, "DUETIME_REDIS_URL", None),
                      namespace=getattr(settings, "DUETIME_NAMESPACE", None))
