"""``--deadline TIME``: a wall-clock time of the local zone, resolved to Unix seconds once, at
start-up.

``HH:MM`` is the next such local time (``07:00`` given in the evening is tomorrow morning), counted
on the calendar of the local zone (``TZ``, else the system's), not as a fixed number of hours from
now: the evening before a daylight-saving change, ``07:00`` is 07:00 on the clock of the next
morning (in Europe/Berlin the night of 28-29 March 2026: 05:00 UTC, not 06:00; of 24-25 October:
06:00 UTC, not 05:00). A time the clock skips that night (02:30 when it jumps from 02:00 to 03:00)
is the moment as many minutes after the skip (03:30); a time it shows twice (02:30 when it goes back
from 03:00 to 02:00) is the first of them. An ISO date and time (``2026-12-02T07:00``) is local time
the same way, unless it gives its offset (``2026-12-02T07:00+01:00``).
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from datetime import time as clock_time


def parse_deadline(text: str, now: float | None = None) -> float:
    """``--deadline TIME`` (see the module docstring) as Unix seconds; ``now`` (Unix seconds,
    default the current time) is what "the next" is counted from. Raises ValueError naming the
    expected forms."""
    now = time.time() if now is None else now
    text = text.strip()
    try:
        hours, minutes = (int(x) for x in text.split(":"))
        if not (0 <= hours < 24 and 0 <= minutes < 60):
            raise ValueError
    except ValueError:
        pass
    else:
        # naive on purpose: the local calendar day now
        today = datetime.fromtimestamp(now).date()  # noqa: DTZ006
        for days in (
            0,
            1,
            2,
        ):  # tomorrow's is always later, unless the clock skips a day (Samoa, 2011)
            # a naive local time converts through the local zone's rules on that day (fold 0: the
            # first of a time shown twice; a skipped time: the offset before the skip)
            when = datetime.combine(
                today + timedelta(days=days), clock_time(hours, minutes)
            ).timestamp()
            if when > now:
                return when
    try:
        when = datetime.fromisoformat(text)
        return (
            when if when.tzinfo is not None else when.astimezone()
        ).timestamp()  # naive: local time
    except ValueError:
        raise ValueError(
            f"--deadline {text!r}: expected HH:MM (e.g. 07:00) or an ISO time (2026-12-02T07:00)"
        ) from None
