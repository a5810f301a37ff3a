"""The share-group dashboard (docs/operations.md "Dashboard"): one self-contained HTML page and
its JSON.

Every worker's Faust web server serves (:mod:`queueflow.faust_app` registers them):

``/queueflow/``
    :func:`page_html`: one HTML page with inline CSS and JavaScript (no build step, no CDN: it
    works offline) that polls the JSON below every second and draws each share group: state,
    epochs, members with their assignments and, per share-partition, the in-flight records from
    the SPSO to the SPEO as in KIP-932's figure, coloured by state (Available, Acquired,
    Acknowledged, Archived), with delivery counts, the log end offset and the lag.
``/queueflow/api/groups``
    :meth:`DashboardData.get`: :meth:`queueflow.admin.ShareGroupAdmin.overview` as JSON, the
    data of ``queueflow share-groups --describe`` and ``--offsets`` (the same
    :func:`~queueflow.admin.describe_json` encoding as the CLI's ``--json``), with the in-flight
    records of each share-partition as batches (first :data:`RECORDS_LIMIT` from the SPSO).
    The page shows exactly this, so page and admin API agree by construction.

The data is read from the app's changelogs (see :mod:`queueflow.admin`), so any worker of the
app, leader or member, shows every group. It is read at most once per ``max_age_s`` however many
pages poll, and at most once per five times the last read's duration: a worker spends at most
a fifth of its time on the dashboard (a read of ``make demo``'s changelogs costs about 0.05 s of
CPU), so a page left open does not starve a leader's event loop.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from importlib import resources
from typing import Any

from queueflow.admin import ShareGroupAdmin, describe_json

__all__ = ["API_PATH", "PAGE_PATH", "RECORDS_LIMIT", "DashboardData", "page_html"]

#: Where the page is served on a worker's web server.
PAGE_PATH = "/queueflow/"
#: Where its JSON is served.
API_PATH = "/queueflow/api/groups"
#: In-flight records per share-partition sent to the page (bounds the answer).
RECORDS_LIMIT = 2000


def page_html() -> str:
    """The dashboard page: HTML with inline CSS and JavaScript, polling :data:`API_PATH`."""
    return resources.files(__package__).joinpath("page.html").read_text(encoding="utf-8")


class DashboardData:
    """The dashboard's JSON, read through ``admin`` at most once per ``max_age_s`` seconds.

    Args:
        admin: the app's :class:`~queueflow.admin.ShareGroupAdmin`.
        records_limit: in-flight records per share-partition to include (>= 0).
        max_age_s: how old (s) an answer may be before the next request reads again (at
            least five times the last read's duration).
        clock: monotonic seconds (tests pass a fake one).

    Raises:
        ValueError: ``records_limit`` < 0 or ``max_age_s`` < 0.
    """

    def __init__(
        self,
        admin: ShareGroupAdmin,
        records_limit: int = RECORDS_LIMIT,
        max_age_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if records_limit < 0 or max_age_s < 0:
            raise ValueError(
                f"records_limit={records_limit}, max_age_s={max_age_s}: both must be >= 0"
            )
        self.admin = admin
        self.records_limit = records_limit
        self.max_age_s = max_age_s
        self._clock = clock
        self._lock = asyncio.Lock()
        self._cached: dict[str, Any] | None = None
        self._read_at = 0.0
        self._min_age_s = max_age_s

    async def get(self) -> dict[str, Any]:
        """The groups as a JSON-ready dict.

        Returns:
            ``{"app_id", "generated_at_ms", "records_limit", "groups": [...], "error"}``: each
            group is its :class:`~queueflow.admin.ShareGroupDescription` (``group_id``,
            ``state``, ``group_epoch``, ``assignment_epoch``, ``partitions``, ``members``) plus
            ``share_partitions``, its :class:`~queueflow.admin.SharePartitionOffsets` with
            ``batches``. When the read fails (no group table yet, broker unreachable),
            ``error`` says why and ``groups`` is empty; it never raises.
        """
        async with self._lock:  # one read at a time; the others wait for its answer
            if self._cached is not None and self._clock() - self._read_at < self._min_age_s:
                return self._cached
            started = self._clock()
            answer: dict[str, Any] = {
                "app_id": self.admin.app_id,
                "generated_at_ms": int(time.time() * 1000),
                "records_limit": self.records_limit,
                "groups": [],
                "error": None,
            }
            try:
                for description, offsets in await self.admin.overview(self.records_limit):
                    group = describe_json(description)
                    group["share_partitions"] = describe_json(offsets)
                    answer["groups"].append(group)
            except Exception as exc:  # shown on the page; the next poll tries again
                answer["error"] = f"{type(exc).__name__}: {exc}"
            self._cached, self._read_at = answer, self._clock()
            self._min_age_s = max(self.max_age_s, 5 * (self._read_at - started))
            return answer
