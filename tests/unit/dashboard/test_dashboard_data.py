"""The dashboard's JSON (:mod:`queueflow.dashboard`) through ``InProcessCluster``'s admin: the
same data as the admin API, with the in-flight records as batches from the SPSO, capped."""

from __future__ import annotations

import re
from typing import Any

import pytest
from inprocess_helpers import TOPIC, cluster_with, poll_until, run

from queueflow import ACCEPT, REJECT, RELEASE
from queueflow.admin import describe_json
from queueflow.dashboard import DashboardData, page_html
from queueflow.testing import FakeClock


def test_the_json_is_the_admin_apis_data_with_the_in_flight_batches() -> None:
    clock = FakeClock()

    async def scenario() -> None:
        async with cluster_with(10, clock=clock, delivery_count_limit=2) as cluster:
            consumer = cluster.consumer("g", acknowledgement_mode="explicit", client_id="c1")
            await consumer.subscribe([TOPIC])
            got = sorted(await poll_until(consumer, 10, clock), key=lambda r: r.offset)
            # 0: ACCEPT (SPSO moves past it); 2: REJECT; 3: RELEASE (Available, count 1);
            # 4: ACCEPT; the rest stay Acquired.
            for offset, kind in ((0, ACCEPT), (2, REJECT), (3, RELEASE), (4, ACCEPT)):
                consumer.acknowledge(got[offset], kind)
            await consumer.commit_sync()

            admin = cluster.admin()
            data = DashboardData(admin, records_limit=1000, max_age_s=0.0)
            answer = await data.get()
            assert answer["error"] is None and answer["app_id"] == admin.app_id
            (group,) = answer["groups"]
            (described,) = await admin.describe_groups(["g"])
            offsets = await admin.list_offsets("g", records_limit=1000)
            assert {k: v for k, v in group.items() if k != "share_partitions"} == describe_json(
                described
            )
            assert group["share_partitions"] == describe_json(offsets)
            (sp,) = group["share_partitions"]
            assert (sp["start_offset"], sp["end_offset"], sp["log_end_offset"]) == (1, 10, 10)
            member = consumer.member_id
            assert [
                (b["first_offset"], b["last_offset"], b["state"], b["delivery_count"])
                for b in sp["batches"]
            ] == [
                (1, 1, "ACQUIRED", 1),
                (2, 2, "ARCHIVED", 1),
                (3, 3, "AVAILABLE", 1),
                (4, 4, "ACKNOWLEDGED", 1),
                (5, 9, "ACQUIRED", 1),
            ]
            assert {b["member_id"] for b in sp["batches"] if b["state"] == "ACQUIRED"} == {member}
            assert sp["in_flight"] == {
                "AVAILABLE": 1,
                "ACQUIRED": 6,
                "ACKNOWLEDGED": 1,
                "ARCHIVED": 1,
            }

            # Capped: only the first 3 records from the SPSO; the last batch is cut.
            capped = await admin.list_offsets("g", records_limit=3)
            assert [(b.first_offset, b.last_offset) for b in capped[0].batches] == [
                (1, 1),
                (2, 2),
                (3, 3),
            ]
            assert (await admin.list_offsets("g"))[0].batches == ()  # none unless asked
            with pytest.raises(ValueError, match="records_limit=-1"):
                await admin.list_offsets("g", records_limit=-1)
            await consumer.close()

    run(scenario())


def test_answers_are_cached_for_max_age_and_errors_are_reported() -> None:
    now = [0.0]

    class Admin:
        app_id = "app"
        calls = 0

        slow = False

        async def overview(self, records_limit: int) -> list[Any]:
            Admin.calls += 1
            if Admin.slow:
                now[0] += 2.0
            if Admin.calls == 2:
                raise TimeoutError("could not read the changelog")
            return []

    async def scenario() -> None:
        data = DashboardData(Admin(), max_age_s=1.0, clock=lambda: now[0])  # type: ignore[arg-type]
        first = await data.get()
        assert first["groups"] == [] and first["error"] is None
        now[0] = 0.5
        assert await data.get() is first and Admin.calls == 1
        now[0] = 1.5
        failed = await data.get()
        assert failed["error"] == "TimeoutError: could not read the changelog"
        # A slow read (2 s) spaces the next ones: at most a fifth of the time reading.
        now[0] = 3.0
        Admin.slow = True
        assert (await data.get())["error"] is None and now[0] == 5.0 and Admin.calls == 3
        assert await data.get() is not failed and Admin.calls == 3  # cached until 5 + 10 s
        now[0] = 14.9
        await data.get()
        assert Admin.calls == 3
        now[0] = 15.1
        Admin.slow = False
        await data.get()
        assert Admin.calls == 4
        with pytest.raises(ValueError, match="records_limit=-1"):
            DashboardData(Admin(), records_limit=-1)  # type: ignore[arg-type]

    run(scenario())


def test_the_page_is_self_contained() -> None:
    """No CDN, no external script, style or font: the page works offline."""
    html = page_html()
    assert "/queueflow/api/groups" in html
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html)
    assert not re.search(r"@import|url\(\s*['\"]?https?:", html)
