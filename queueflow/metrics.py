"""Prometheus metrics (prometheus_client), per app: one :class:`Metrics` per queueflow app, each on
its own :class:`~prometheus_client.CollectorRegistry`, so two apps in one process do not collide.
A worker serves them at ``/metrics`` on its Faust web server (:mod:`queueflow.faust_app` renders
them with :meth:`Metrics.render`, or :func:`render_all` next to the app's own registry).

Members (share agents):

* ``queueflow_records_delivered_total{group,topic}``: deliveries to handlers;
* ``queueflow_records_redelivered_total{group,topic}``: deliveries with delivery count > 1;
* ``queueflow_acknowledgements_total{group,topic,type}``: outcomes (accept/release/reject/gap);
* ``queueflow_handler_errors_total{group,topic,reason}``: raised / invalid_outcome / undecodable /
  timeout (cancelled at the handler timeout or before the record's lock expired);
* ``queueflow_share_agent_stuck_handlers{group,topic}``: handler calls that ignored their
  cancellation (when it equals the concurrency, the member holds no queued records);
* ``queueflow_acknowledgements_dropped_total{group,topic}``: outcomes the leader refused as stale;
* ``queueflow_records_lock_expired_unhandled_total{group,topic}``: records released without
  calling the handler because their lock expired while they waited;
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

from collections.abc import Iterable

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

__all__ = ["CONTENT_TYPE", "Metrics", "render_all"]

#: Content type of :meth:`Metrics.render` and :func:`render_all`: prometheus_client's text format,
#: with its ``version`` and ``charset`` parameters (aiohttp's ``content_type=`` wants only the part
#: before the first ``;``, e.g. ``web.bytes(body, content_type=CONTENT_TYPE.split(";")[0])``).
CONTENT_TYPE: str = CONTENT_TYPE_LATEST

_MEMBER = ("group", "topic")
_PARTITION = ("group", "topic", "partition")
_FETCH_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)


class Metrics:
    """Every queueflow metric of one app, registered on one registry.

    Attributes are the metrics listed in the module docstring, named in lower case: counters
    ``delivered``, ``redelivered``, ``acknowledgements``, ``handler_errors``,
    ``acknowledgements_dropped``, ``lock_expired_unhandled``, ``state_writes``,
    ``leader_step_downs``; histogram ``share_fetch_seconds`` (seconds); gauges ``drain_seconds``
    (seconds), ``in_flight``, ``acquired``, ``start_offset``, ``group_members``, ``group_epoch``.
    KIP-932 has no metric names for these; they follow the KIP's terms (SPSO, SPEO, in-flight).

    Args:
        registry: where to register the metrics. None (the default) creates a private
            :class:`~prometheus_client.CollectorRegistry`, so each app's metrics are its own.

    Raises:
        ValueError: from prometheus_client, when ``registry`` already holds queueflow metrics
            (one :class:`Metrics` per registry).
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = CollectorRegistry() if registry is None else registry
        reg = self.registry
        self.delivered = Counter(
            "queueflow_records_delivered", "Records delivered to handlers", _MEMBER, registry=reg
        )
        self.redelivered = Counter(
            "queueflow_records_redelivered",
            "Deliveries with delivery count > 1",
            _MEMBER,
            registry=reg,
        )
        self.acknowledgements = Counter(
            "queueflow_acknowledgements",
            "Acknowledgements by type",
            (*_MEMBER, "type"),
            registry=reg,
        )
        self.handler_errors = Counter(
            "queueflow_handler_errors",
            "Handler failures by reason",
            (*_MEMBER, "reason"),
            registry=reg,
        )
        self.acknowledgements_dropped = Counter(
            "queueflow_acknowledgements_dropped",
            "Outcomes the leader refused as stale (lock expired, or acknowledged already); those "
            "records are delivered again",
            _MEMBER,
            registry=reg,
        )
        self.lock_expired_unhandled = Counter(
            "queueflow_records_lock_expired_unhandled",
            "Records released without calling the handler: their acquisition lock expired while "
            "they waited for one",
            _MEMBER,
            registry=reg,
        )
        self.stuck_handlers = Gauge(
            "queueflow_share_agent_stuck_handlers",
            "Handler calls still running after being cancelled at their timeout",
            _MEMBER,
            registry=reg,
        )
        self.share_fetch_seconds = Histogram(
            "queueflow_share_fetch_seconds",
            "ShareFetch round-trip time",
            _MEMBER,
            buckets=_FETCH_BUCKETS,
            registry=reg,
        )
        self.drain_seconds = Gauge(
            "queueflow_drain_seconds",
            "Duration of the last graceful drain",
            ("group", "agent"),
            registry=reg,
        )
        self.in_flight = Gauge(
            "queueflow_share_partition_in_flight_records", "SPEO - SPSO", _PARTITION, registry=reg
        )
        self.acquired = Gauge(
            "queueflow_share_partition_acquired_records",
            "Acquired records",
            _PARTITION,
            registry=reg,
        )
        self.start_offset = Gauge(
            "queueflow_share_partition_start_offset", "The SPSO", _PARTITION, registry=reg
        )
        self.state_writes = Counter(
            "queueflow_state_writes",
            "Durable state writes (deltas and snapshots)",
            ("topic",),
            registry=reg,
        )
        self.leader_step_downs = Counter(
            "queueflow_leader_step_downs",
            "Partitions a fenced or stalled leader stepped down from",
            ("topic",),
            registry=reg,
        )
        self.ticket_refusals = Counter(
            "queueflow_ticket_refusals",
            "ShareFetch / acknowledgement requests a leader refused after checking their "
            "assignment ticket (reason: missing, bad_ticket, expired, wrong_member, wrong_group, "
            "removed, fenced_epoch, not_assigned)",
            ("topic", "reason"),
            registry=reg,
        )
        self.coordinator_step_downs = Counter(
            "queueflow_coordinator_step_downs",
            "Coordinator partitions a fenced or stalled share-group coordinator stepped down from",
            registry=reg,
        )
        self.coordinator_unserved = Counter(
            "queueflow_coordinator_unserved",
            "Coordinator requests skipped because this worker no longer owns the coordinator "
            "partition (reason: not_owner) or its Faust membership lease lapsed (lease)",
            ("reason",),
            registry=reg,
        )
        self.stale_coordinator_refusals = Counter(
            "queueflow_stale_coordinator_refusals",
            "Messages of a share-group coordinator older than the newest one seen for the group, "
            "refused (receiver: leader, member; kind: ticket, release_member, "
            "reset_share_partition, heartbeat_response)",
            ("receiver", "kind"),
            registry=reg,
        )
        self.group_members = Gauge(
            "queueflow_share_group_members", "Members per share group", ("group",), registry=reg
        )
        self.group_epoch = Gauge(
            "queueflow_share_group_epoch", "Group epoch", ("group",), registry=reg
        )

    def render(self) -> tuple[bytes, str]:
        """This app's metrics for a ``/metrics`` page.

        Returns:
            ``(body, content_type)``: the Prometheus text exposition of :attr:`registry` and
            :data:`CONTENT_TYPE`.
        """
        return generate_latest(self.registry), CONTENT_TYPE


class _Merged(Collector):
    """A collector yielding the metric families of several registries, one family per name."""

    def __init__(self, registries: Iterable[CollectorRegistry]) -> None:
        self._registries = tuple(registries)

    def collect(self) -> Iterable[Metric]:
        families: dict[str, Metric] = {}
        for registry in self._registries:
            for family in registry.collect():
                merged = families.get(family.name)
                if merged is None:
                    # A copy: collectors may hand out objects they keep; never extend those.
                    merged = Metric(family.name, family.documentation, family.type, family.unit)
                    families[family.name] = merged
                # Two registries with the same family (two apps, or an app that registered its
                # own copy) give one HELP/TYPE header with the samples of both.
                merged.samples.extend(family.samples)
        return families.values()


def render_all(*registries: CollectorRegistry) -> bytes:
    """The text exposition of several registries as one valid ``/metrics`` body.

    For an app that serves its own ``/metrics`` page: ``render_all(REGISTRY, metrics.registry)``.
    Families that appear in more than one registry are merged (one HELP/TYPE header); samples
    are not deduplicated. Serve it with :data:`CONTENT_TYPE`.

    Args:
        registries: the registries, in output order; none gives an empty body.
    """
    combined = CollectorRegistry(auto_describe=False)
    combined.register(_Merged(registries))
    return generate_latest(combined)
