"""Cron schedules of suites, run by Celery beat.

`schedules_tick` runs every minute. A suite whose latest cron slot (five fields, UTC) is after the last
slot it ran for gets one run for that slot. The run's (suite, slot) pair is unique in the database, so
several beat processes, or a tick that runs twice, still make one run. Slots missed while nothing was
ticking are not made up: only the latest one runs, so a day of downtime does not start a storm of runs.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

from croniter import CroniterBadDateError, croniter
from django.utils import timezone

from evals import runs
from evals.models import Run, RunTrigger, Suite

logger = logging.getLogger("evals.schedules")

# What the derived configuration's schedule words mean.
PRESETS = {"nightly": "0 2 * * *", "weekly": "0 3 * * 1", "hourly": "0 * * * *"}


def cron_error(expression: str) -> str | None:
    """Why a cron expression is not usable, or None. Five fields only (minute hour day month weekday)."""
    expression = PRESETS.get(expression, expression)
    if len(expression.split()) != 5:
        return "use five fields: minute hour day-of-month month day-of-week (e.g. '0 2 * * *')"
    if not croniter.is_valid(expression):
        return f"{expression!r} is not a valid cron expression"
    # Valid fields can still name no date at all ('0 0 31 2 *'): croniter then finds no slot either way,
    # and the suite could neither be scheduled nor shown.
    try:
        croniter(expression, datetime.now(UTC)).get_next(datetime)
        croniter(expression, datetime.now(UTC)).get_prev(datetime)
    except CroniterBadDateError:
        return f"{expression!r} never matches a date"
    return None


def cron_expression(expression: str) -> str:
    return PRESETS.get(expression, expression)


def slot_latest(expression: str, now: datetime) -> datetime:
    """The latest slot at or before `now`, in UTC."""
    # Slots are whole minutes and croniter's get_prev is strict: counting back from the next second makes
    # a moment exactly on a slot that slot.
    moment = now.astimezone(UTC).replace(microsecond=0) + timedelta(seconds=1)
    previous: datetime = croniter(cron_expression(expression), moment).get_prev(datetime)
    return previous.astimezone(UTC)


def slot_next(expression: str, after: datetime) -> datetime:
    following: datetime = croniter(cron_expression(expression), after.astimezone(UTC)).get_next(datetime)
    return following.astimezone(UTC)


def schedule_start(*, suite: Suite, now: datetime | None = None) -> None:
    """Switching a schedule on counts from now: the first run is at the next slot, not a past one."""
    now = now or timezone.now()
    suite.schedule_last_slot = slot_latest(suite.schedule_cron, now)


def schedules_tick(*, now: datetime | None = None) -> list[Run]:
    """One run per suite whose schedule has a slot due since its last run; returns the runs made."""
    now = now or timezone.now()
    made: list[Run] = []
    for suite in Suite.objects.filter(schedule_enabled=True).exclude(schedule_cron="").select_related("dataset"):
        if cron_error(suite.schedule_cron):
            continue
        slot = slot_latest(suite.schedule_cron, now)
        if suite.schedule_last_slot is not None and slot <= suite.schedule_last_slot:
            continue
        try:
            run = runs.run_create(suite=suite, trigger=RunTrigger.SCHEDULE, scheduled_for=slot)
        except runs.RunNotStartable as error:
            logger.warning("scheduled run of suite %s skipped: %s", suite.name, error.detail)
            Suite.objects.filter(pk=suite.pk).update(schedule_last_slot=slot)
            continue
        Suite.objects.filter(pk=suite.pk).update(schedule_last_slot=slot)
        made.append(run)
    return made
