"""The dashboard and the share-partition metrics of a leader worker on the real broker
(issue #14 items 6-7): a member holds records Acquired, the page is opened in headless Chromium
(Debian's ``chromium``), screenshotted, and what it shows is checked against the admin API; so
are ``/metrics`` and the worker's JSON log lines."""

from __future__ import annotations

import asyncio
import json
import os
import time
import urllib.request
import uuid
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from admin_env import LEADER_SETTINGS, MEMBER_SETTINGS, WAIT_S
from prometheus_client.parser import text_string_to_metric_families

from queueflow import ACCEPT, REJECT, RELEASE, ShareConsumer, ShareRecord
from queueflow.admin import ShareGroupAdmin, describe_json
from queueflow.devtools.broker import create_topic
from queueflow.devtools.browser import dump_dom, screenshot
from queueflow.kafka.config import KafkaClientConfig
from queueflow.testing import LeaderWorker
from queueflow.testing import produce as produce_records


@pytest.fixture(scope="module")
def app(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    topic = f"qf-dash-{uuid.uuid4().hex[:8]}"
    create_topic(kafka_bootstrap, topic, 2)
    app_id = f"qf-dash-{uuid.uuid4().hex[:8]}"
    worker = LeaderWorker(
        app_id,
        [topic],
        kafka_bootstrap,
        tmp_path_factory.mktemp("dash") / "data",
        LEADER_SETTINGS,
    )
    with worker.start():
        yield {"topic": topic, "app_id": app_id, "worker": worker}


class Elements(HTMLParser):
    """The attributes of every element with a ``data-*`` attribute, by tag and class."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[tuple[str, dict[str, str]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = {k: v or "" for k, v in attrs}
        if any(k.startswith("data-") for k in values):
            self.found.append((f"{tag}.{values.get('class', '')}", values))

    def of(self, kind: str) -> list[dict[str, str]]:
        return [a for k, a in self.found if k == kind]


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=30) as response:
        return bytes(response.read())


def test_dashboard_shows_what_the_admin_api_reports(
    kafka_bootstrap: str, app: dict[str, Any], tmp_path: Path
) -> None:
    topic, app_id, worker = app["topic"], app["app_id"], app["worker"]
    base = f"http://127.0.0.1:{worker.web_port}"
    admin = ShareGroupAdmin(app_id, KafkaClientConfig(kafka_bootstrap))

    async def hold() -> tuple[ShareConsumer, list[ShareRecord]]:
        await produce_records(kafka_bootstrap, topic, [f"r{i}" for i in range(12)], partitions=2)
        holder = ShareConsumer(
            "g",
            app_id=app_id,
            bootstrap_servers=kafka_bootstrap,
            acknowledgement_mode="explicit",
            settings=MEMBER_SETTINGS,
            client_id="dash-client",
        )
        await holder.subscribe([topic])
        deadline = time.monotonic() + WAIT_S
        while True:  # a poll with >= 4 of one partition (explicit mode: acknowledge all of a
            # poll before the next; so they are taken from one poll)
            assert time.monotonic() < deadline, "no poll returned 4 records of a partition"
            polled = await holder.poll(timeout_ms=500)
            parts = [r.partition for r in polled]
            held = sorted(
                (r for r in polled if parts and r.partition == max(parts, key=parts.count)),
                key=lambda r: r.offset,
            )
            if len(held) >= 4:
                break
            for r in polled:  # too few: let them go, poll again
                holder.acknowledge(r, RELEASE)
        # Every state in the window: the lowest offset stays Acquired (so the SPSO stays there),
        # the next is ACCEPTed, the next REJECTed, the next RELEASEd (Available, or Acquired
        # again by a prefetch); the rest stay Acquired (locks of 60 s).
        for r, kind in zip(held[1:4], (ACCEPT, REJECT, RELEASE), strict=True):
            holder.acknowledge(r, kind)
        assert all(e is None for e in (await holder.commit_sync()).values())
        return holder, held

    def beats(group: dict[str, Any]) -> list[int]:
        return [m["last_heartbeat_ms"] for m in group["members"]]

    def without_beats(group: dict[str, Any]) -> dict[str, Any]:
        members = [
            {k: v for k, v in m.items() if k != "last_heartbeat_ms"} for m in group["members"]
        ]
        return {**group, "members": members}

    async def admin_view() -> tuple[Any, list[Any]]:
        (described,) = await admin.describe_groups(["g"])
        return described, await admin.list_offsets("g", records_limit=2000)

    async def scenario() -> None:
        holder, held = await hold()
        try:
            await check(holder, held)
        finally:
            await holder.close()

    async def check(holder: ShareConsumer, held: list[ShareRecord]) -> None:
        # Blocking calls (HTTP, Chromium) run in threads: the holder must keep heartbeating.
        # What the holder prefetched may still arrive: wait until two reads agree.
        described, offsets = await admin_view()
        deadline = time.monotonic() + WAIT_S
        while True:
            await asyncio.sleep(1.0)
            again = await admin_view()
            if again == (described, offsets):
                break
            assert time.monotonic() < deadline, "the share-partitions kept changing"
            described, offsets = again
        mine = next(o for o in offsets if o.partition == held[0].partition)
        assert mine.start_offset == held[0].offset
        assert (mine.in_flight["ACKNOWLEDGED"], mine.in_flight["ARCHIVED"]) == (1, 1)
        assert mine.in_flight["ACQUIRED"] >= len(held) - 3 >= 1

        # The JSON the page polls is the admin API's data.
        api = json.loads(await asyncio.to_thread(get, f"{base}/queueflow/api/groups"))
        assert api["error"] is None
        (group,) = api["groups"]
        # The holder heartbeats between the two reads: its stored heartbeat time may move on.
        shown_group = {k: v for k, v in group.items() if k != "share_partitions"}
        expected_group = describe_json(described)
        assert beats(shown_group) >= beats(expected_group)
        assert without_beats(shown_group) == without_beats(expected_group)
        assert group["share_partitions"] == describe_json(offsets)

        # The page, rendered by headless Chromium after its first polls.
        dom = Elements()
        dom.feed(await asyncio.to_thread(dump_dom, f"{base}/queueflow/", 5000))
        (card,) = dom.of("article.group")
        assert (card["data-group"], card["data-state"]) == ("g", described.state)
        assert int(card["data-group-epoch"]) == described.group_epoch
        assert described.coordinator and card["data-coordinator"] == described.coordinator
        assert [m["data-member-id"] for m in dom.of("tr.member")] == [holder.member_id]
        shown = {(s["data-topic"], int(s["data-partition"])): s for s in dom.of("section.sp")}
        assert len(shown) == len(offsets) == 2
        for o in offsets:
            s = shown[(o.topic, o.partition)]
            assert (int(s["data-spso"]), int(s["data-speo"])) == (o.start_offset, o.end_offset)
            assert (int(s["data-log-end"]), int(s["data-lag"])) == (o.log_end_offset, o.lag)
            assert o.leader and s["data-leader"] == o.leader
            for state, count in o.in_flight.items():
                assert int(s[f"data-{state.lower()}"]) == count, (state, s)
        # One box per in-flight record (few records): coloured by state, with its count.
        boxes = sorted(
            (int(b["data-first"]), b["data-state"], int(b["data-delivery-count"]))
            for b in dom.of("g.batch")
        )
        expected = sorted(
            (offset, b.state, b.delivery_count)
            for o in offsets
            for b in o.batches
            for offset in range(b.first_offset, b.last_offset + 1)
        )
        in_flight = sum(o.end_offset - o.start_offset for o in offsets if o.end_offset)
        assert boxes == expected and len(boxes) == in_flight > 0

        png = await asyncio.to_thread(
            screenshot, f"{base}/queueflow/", tmp_path / "dashboard.png", budget_ms=5000
        )
        data = png.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
        if os.environ.get("QUEUEFLOW_DASHBOARD_SCREENSHOT"):  # docs/img/dashboard-records.png
            Path(os.environ["QUEUEFLOW_DASHBOARD_SCREENSHOT"]).write_bytes(data)

        # /metrics: the leader's gauges agree with the admin API, with no ShareFetch since.
        families = {
            f.name: f
            for f in text_string_to_metric_families(
                (await asyncio.to_thread(get, f"{base}/metrics")).decode()
            )
        }

        def value(name: str, o: Any, **extra: str) -> float:
            labels = {"group": "g", "topic": topic, "partition": str(o.partition), **extra}
            (found,) = [s.value for s in families[name].samples if s.labels == labels]
            return found

        for o in offsets:
            records = "queueflow_share_partition_records"
            for state, count in o.in_flight.items():
                assert value(records, o, state=state.lower()) == count
            assert value("queueflow_share_partition_lag_records", o) == o.lag
            assert value("queueflow_share_partition_log_end_offset", o) == o.log_end_offset
            assert value("queueflow_share_partition_end_offset", o) == o.end_offset

    asyncio.run(scenario())

    # The worker's JSON log lines carry group, topic and partition where known.
    (first,) = [e for e in worker.events("share_partition_initialised") if e["partition"] == 0]
    assert (first["group"], first["topic"], first["logger"]) == (
        "g",
        topic,
        "queueflow.server.leader",
    )
