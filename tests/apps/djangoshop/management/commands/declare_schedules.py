from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Declare the duetime schedules of this project (safe to run at every deploy)."

    def handle(self, *args: Any, **options: Any) -> None:
        from tests.apps.djangoshop.jobs import declare_schedules

        for name, status in declare_schedules().items():
            self.stdout.write(f"{name}: {status}")
