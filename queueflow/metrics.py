"""Prometheus metrics (prometheus_client), served by each worker's Faust web server at
``/metrics``.

Members (share agents):

* ``queueflow_records_delivered_total{group,topic}``: deliveries to handlers;
* ``queueflow_records_redelivered_total{group,topic}``: deliveries with delivery count > 1;
* ``queueflow_acknowledgements_total{group,topic,type}``: outcomes (accept/release/reject/gap);
* ``queueflow_handler_errors_total{group,topic,reason}``: raised / invalid_outcome / undecodable;
* ``queueflow_share_fetch_seconds{group,topic}``: ShareFetch round trips;
* ``queueflow_drain_seconds{group,agent}``: how long the last graceful drain took.

Leaders and coordinators:

* ``queueflow_share_partition_in_flight_records{group,topic,partition}``: SPEO - SPSO;
* ``queueflow_share_partition_acquired_records{group,topic,partition}``;
* ``queueflow_share_partition_start_offset{group,topic,partition}``: the SPSO;
* ``queueflow_state_writes_total{topic}``: deltas and snapshots written;
* ``queueflow_leader_step_downs_total{topic}``: request partitions a fenced or stalled leader
  stepped down from (:mod:`queueflow.engine.fencing`);
* ``queueflow_share_group_members{group}``, ``queueflow_share_group_epoch{group}``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CONTENT_TYPE_LATEST, Counter, Gauge, Histogram, generate_latest

if TYPE_CHECKING:
    import faust

_MEMBER = ("group", "topic")
_PARTITION = ("group", "topic", "partition")

DELIVERED = Counter("queueflow_records_delivered", "Records delivered to handlers", _MEMBER)
REDELIVERED = Counter(
    "queueflow_records_redelivered", "Deliveries with delivery count > 1", _MEMBER
)
ACKNOWLEDGEMENTS = Counter(
    "queueflow_acknowledgements", "Acknowledgements by type", (*_MEMBER, "type")
)
HANDLER_ERRORS = Counter(
    "queueflow_handler_errors", "Handler failures by reason", (*_MEMBER, "reason")
)
ACKNOWLEDGEMENTS_DROPPED = Counter(
    "queueflow_acknowledgements_dropped",
    "Outcomes the leader refused as stale (lock expired, or acknowledged already); those "
    "records are delivered again",
    _MEMBER,
)
LOCK_EXPIRED_UNHANDLED = Counter(
    "queueflow_records_lock_expired_unhandled",
    "Records released without calling the handler: their acquisition lock expired while they "
    "waited for one",
    _MEMBER,
)
SHARE_FETCH_SECONDS = Histogram(
    "queueflow_share_fetch_seconds",
    "ShareFetch round-trip time",
    _MEMBER,
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0),
)
DRAIN_SECONDS = Gauge(
    "queueflow_drain_seconds", "Duration of the last graceful drain", ("group", "agent")
)
IN_FLIGHT = Gauge("queueflow_share_partition_in_flight_records", "SPEO - SPSO", _PARTITION)
ACQUIRED = Gauge("queueflow_share_partition_acquired_records", "Acquired records", _PARTITION)
START_OFFSET = Gauge("queueflow_share_partition_start_offset", "The SPSO", _PARTITION)
STATE_WRITES = Counter(
    "queueflow_state_writes", "Durable state writes (deltas and snapshots)", ("topic",)
)
LEADER_STEP_DOWNS = Counter(
    "queueflow_leader_step_downs",
    "Partitions a fenced or stalled leader stepped down from",
    ("topic",),
)
GROUP_MEMBERS = Gauge("queueflow_share_group_members", "Members per share group", ("group",))
GROUP_EPOCH = Gauge("queueflow_share_group_epoch", "Group epoch", ("group",))


def expose(app: faust.App) -> None:
    """Serve the metrics at ``/metrics`` on the app's Faust web server (aiohttp)."""

    @app.page("/metrics")
    async def metrics(web: object, request: object) -> object:
        return app.web.bytes(generate_latest(), content_type=CONTENT_TYPE_LATEST.split(";")[0])
