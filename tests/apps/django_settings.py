"""A minimal Django project's settings for tests/outbox/test_django.py: one tiny app
(tests.apps.djangoshop) on the tests' private PostgreSQL (DSN from DUETIME_TEST_PG_DSN)."""

from __future__ import annotations

import os
from urllib.parse import urlsplit

_dsn = urlsplit(os.environ.get("DUETIME_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:1/postgres"))

SECRET_KEY = "tests-only"
USE_TZ = True
INSTALLED_APPS = ["tests.apps.djangoshop"]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _dsn.path.lstrip("/"),
        "USER": _dsn.username or "postgres",
        "HOST": _dsn.hostname,
        "PORT": _dsn.port,
    }
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
# read by tests.apps.djangoshop.apps.ShopConfig.ready(): where the duetime app points
DUETIME_REDIS_URL = os.environ.get("DUETIME_REDIS_URL")
DUETIME_NAMESPACE = os.environ.get("DUETIME_NAMESPACE")
