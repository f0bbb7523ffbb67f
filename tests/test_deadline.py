"""``--deadline HH:MM`` across a daylight-saving change (issue 32): resolved on the local zone's
calendar (``runner.planning.deadline``), checked against ``zoneinfo`` with ``TZ`` set to
Europe/Berlin and a fixed "now" the evening before each change of 2026 (29 March: 02:00 -> 03:00; 25
October: 03:00 -> 02:00)."""

from __future__ import annotations

import time
from datetime import datetime
from zoneinfo import ZoneInfo

import pytest

from dxi.runner.planning.deadline import parse_deadline

BERLIN = ZoneInfo("Europe/Berlin")


@pytest.fixture
def berlin(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("TZ", "Europe/Berlin")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def at(*when: int, fold: int = 0) -> float:
    """Unix seconds of a Berlin wall-clock time, by zoneinfo (not by the code under test)."""
    return datetime(*when, tzinfo=BERLIN, fold=fold).timestamp()


def test_seven_the_evening_before_the_clocks_go_forward_is_seven_on_the_next_mornings_clock(berlin):
    now = at(2026, 3, 28, 22, 0)  # 21:00 UTC, CET (+01:00)
    assert (
        parse_deadline("07:00", now) == at(2026, 3, 29, 7, 0) == 1774760400.0
    )  # 05:00 UTC (CEST), not 06:00
    assert parse_deadline("23:30", now) == at(2026, 3, 28, 23, 30)  # tonight, before the change
    assert parse_deadline("02:30", now) == at(
        2026, 3, 29, 3, 30
    )  # skipped by the clock: as long after the skip
    assert (
        parse_deadline("2026-03-29T07:00", now) == 1774760400.0
    )  # an ISO time: local on that day, too


def test_seven_the_evening_before_the_clocks_go_back_is_seven_on_the_next_mornings_clock(berlin):
    now = at(2026, 10, 24, 22, 0)  # 20:00 UTC, CEST (+02:00)
    assert (
        parse_deadline("07:00", now) == at(2026, 10, 25, 7, 0) == 1792908000.0
    )  # 06:00 UTC (CET), not 05:00
    assert parse_deadline("02:30", now) == at(2026, 10, 25, 2, 30, fold=0)  # shown twice: the first
    assert at(2026, 10, 25, 2, 30, fold=1) - parse_deadline("02:30", now) == 3600
    # "the next such time" counts days on the calendar: at 06:30 CET on the day of the change, 07:00
    # is in half an hour, though 25 hours have passed since 06:30 of the day before
    assert parse_deadline("07:00", at(2026, 10, 25, 6, 30)) - at(2026, 10, 25, 6, 30) == 1800
