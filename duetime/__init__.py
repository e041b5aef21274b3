"""duetime: a Redis-backed distributed job scheduler.

Application code imports only this package.
"""

from common.context import RunContext, current_run
from common.errors import (
    DuetimeError,
    Fatal,
    InvalidInput,
    PayloadTooLarge,
    RedisUnavailable,
    Retry,
    RunNotFound,
    UnknownTask,
)
from common.models import Attempt, Run
from common.schedule_store import ScheduleInfo, ScheduleNotFound
from common.timespec import At, Cron, Every, InvalidSchedule, Trigger
from duetime.app import App

__all__ = [
    "App", "At", "Attempt", "Cron", "Every", "InvalidSchedule", "ScheduleInfo", "ScheduleNotFound",
    "Trigger", "DuetimeError", "Fatal", "InvalidInput", "PayloadTooLarge",
    "RedisUnavailable", "Retry", "Run", "RunContext", "RunNotFound", "UnknownTask",
    "current_run",
]
