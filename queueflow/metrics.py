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
* ``queueflow_records_given_back_unstarted_total{group,topic}``: records released undelivered
  before their lock expired, because at the measured handling rate no handler would have
  started them in time (docs/concepts.md "Adaptive acquisition");
* ``queueflow_share_fetch_seconds{group,topic}``: ShareFetch round trips;
* ``queueflow_drain_seconds{group,agent}``: how long the last graceful drain took;

* ``queueflow_acknowledgement_latency_seconds{group,topic}``: from the ShareFetch answer that
  delivered a record to its outcome (ACCEPT, RELEASE, REJECT) being queued for the leader.

Leaders, read from the share-partitions at each scrape (:class:`SharePartitionSample`, so they
follow every state change: acknowledgements, lock-expiry ticks, released members, admin resets,
and disappear when the partition moves to another worker):

* ``queueflow_share_partition_in_flight_records{group,topic,partition}``: SPEO - SPSO;
* ``queueflow_share_partition_records{group,topic,partition,state}``: in-flight records by state
  (``available``, ``acquired``, ``acknowledged``, ``archived``);
* ``queueflow_share_partition_acquired_records{group,topic,partition}``;
* ``queueflow_share_partition_start_offset`` / ``_end_offset{group,topic,partition}``: SPSO, SPEO;
* ``queueflow_share_partition_log_end_offset{group,topic,partition}``: the high watermark;
* ``queueflow_share_partition_lag_records{group,topic,partition}``: KIP-1226 lag.

Leaders, counted as they happen:

* ``queueflow_share_partition_acquisitions_total{group,topic,partition}``: records acquired;
* ``queueflow_share_partition_deliveries_total{group,topic,partition,delivery_count}``: the
  same acquisitions by the delivery count they gave the record (1: first delivery);
* ``queueflow_share_partition_archived_records_total{group,topic,partition}``;
* ``queueflow_share_partition_lock_expiries_total{group,topic,partition}``: records whose
  acquisition lock elapsed;
* ``queueflow_state_writes_total{topic}``: deltas and snapshots written;
* ``queueflow_leader_step_downs_total{topic}``: request partitions a fenced or stalled leader
  stepped down from (:mod:`queueflow.engine.fencing`);
* ``queueflow_member_fences_total{group,topic,reason}``: members fenced from a share-partition
  for abuse (``release``: RELEASEing without handling, ``share.member.release.abuse.*``).
* ``queueflow_transactional_acks_total{topic}``: transactional acknowledgements applied from
  the ack topic (``queueflow.processing.guarantee=exactly_once``);
* ``queueflow_ack_reader_lag_seconds{topic,partition}``: how far the lock clock of an
  exactly-once leader trails the wall clock (-1 until its ack reader caught up once): lock
  expiries and releases on that partition wait this long.
* ``queueflow_dead_letter_records_total{group,topic,dead_letter_topic,reason}``: records a
  leader wrote to a group's dead-letter topic (``errors.deadletterqueue.topic.name``);
* ``queueflow_dead_letter_write_failures_total{group,topic,dead_letter_topic}``: failed DLQ
  writes (the topic missing or not writable): the records stay held and are retried;
* ``queueflow_dead_letter_pending_records{group,topic,partition}``: records held for the DLQ
  (Acquired by ``__dead_letter__``) as of the DLQ writer's last round.

Leaders' direct endpoints (docs/operations.md, "The direct port's limits"):

* ``queueflow_direct_connections``: connections open now;
* ``queueflow_direct_connections_refused_total{reason}``: connections closed at once
  (``max_connections``, ``max_connections_per_ip``);
* ``queueflow_direct_connections_dropped_total{reason}``: connections closed later
  (``frame_too_large``, ``read_timeout``, ``unauthenticated_idle``, ``idle``,
  ``write_timeout``, ``undecodable``, ``tls_mismatch``).
* ``queueflow_direct_requests_unserved_total{reason}``: direct requests answered
  ``NOT_LEADER_OR_FOLLOWER`` because the membership lease had lapsed (``lease_acquire``:
  before acquiring, ``lease_answer``: before the answer left, its state write or record read
  having outlasted the lease);
* ``queueflow_leader_lease_lapses_total``: times the leader's membership lease lapsed outside a
  rebalance (docs/architecture.md "The membership lease").

Leaders, coordinators and members: ``queueflow_control_messages_dropped_total{receiver,reason}``:
junk on an internal topic dropped after a look at its first bytes
(:mod:`queueflow.protocol.prefilter`; ``reason``: empty, unknown_format, too_short).

Coordinators: ``queueflow_share_group_members{group}``, ``queueflow_share_group_epoch{group}``,
``queueflow_share_group_rebalances_total{group}`` (group epoch bumps).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

__all__ = [
    "CONTENT_TYPE",
    "RECORD_STATES",
    "Metrics",
    "PendingObservations",
    "SharePartitionSample",
    "render_all",
]

#: Content type of :meth:`Metrics.render` and :func:`render_all`: prometheus_client's text format,
#: with its ``version`` and ``charset`` parameters (aiohttp's ``content_type=`` wants only the part
#: before the first ``;``, e.g. ``web.bytes(body, content_type=CONTENT_TYPE.split(";")[0])``).
CONTENT_TYPE: str = CONTENT_TYPE_LATEST

_MEMBER = ("group", "topic")
_PARTITION = ("group", "topic", "partition")
_FETCH_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)
_ACK_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

#: The in-flight record states, as the ``state`` label of ``queueflow_share_partition_records``.
RECORD_STATES = ("available", "acquired", "acknowledged", "archived")


class PendingObservations:
    """Observations of one histogram (a labelled child) counted here and added to it in one go
    by :meth:`flush`: a hot path (one record's outcome) then costs a bisect, not a locked
    Prometheus ``observe()`` per record. The histogram equals what ``observe()`` per amount
    would have made once flushed (tests/unit/test_metrics_batching.py checks it).

    Args:
        child: a labelled :class:`prometheus_client.Histogram` (``Histogram(...).labels(...)``).
    """

    __slots__ = ("_bounds", "_child", "_counts", "_sum", "pending")

    def __init__(self, child: Histogram) -> None:
        self._child = child
        # prometheus_client's own bucket bounds and values (Histogram._upper_bounds, _buckets,
        # _sum: stable since 0.4, the API has no bulk observe).
        self._bounds: list[float] = list(child._upper_bounds)
        self._counts = [0] * len(self._bounds)
        self._sum = 0.0
        #: Observations not flushed yet.
        self.pending = 0

    def observe(self, amount: float, n: int = 1) -> None:
        """Count ``n`` observations of ``amount`` (as ``observe(amount)`` ``n`` times)."""
        self._counts[bisect_left(self._bounds, amount)] += n
        self._sum += amount * n
        self.pending += n

    def flush(self) -> None:
        """Add the observations counted since the last flush to the histogram."""
        if not self.pending:
            return
        child = self._child
        child._sum.inc(self._sum)
        counts = self._counts
        for i, count in enumerate(counts):
            if count:
                child._buckets[i].inc(count)
                counts[i] = 0
        self._sum = 0.0
        self.pending = 0


@dataclass(frozen=True, slots=True)
class SharePartitionSample:
    """One share-partition's state at scrape time, as a leader reports it.

    Attributes:
        group / topic / partition: the share-partition.
        start_offset / end_offset: the SPSO and the SPEO (exclusive).
        records: in-flight records by state name (:data:`RECORD_STATES`); missing names are 0.
        log_end_offset: the partition's high watermark as last known, None if unknown (then no
            log-end and lag samples).
        lag: KIP-1226 lag (``log_end_offset - SPSO`` minus the Acknowledged and Archived
            in-flight records), None with an unknown log end.
    """

    group: str
    topic: str
    partition: int
    start_offset: int
    end_offset: int
    records: Mapping[str, int]
    log_end_offset: int | None = None
    lag: int | None = None


SampleSource = Callable[[], Iterable[SharePartitionSample]]


class Metrics:
    """Every queueflow metric of one app, registered on one registry.

    Attributes are the metrics listed in the module docstring, named in lower case: counters
    ``delivered``, ``redelivered``, ``acknowledgements``, ``handler_errors``,
    ``acknowledgements_dropped``, ``lock_expired_unhandled``, ``given_back_unstarted``,
    ``state_writes``, ``leader_step_downs``, ``transactional_acks``, ``control_messages_dropped``,
    ``acquisitions``, ``deliveries``,
    ``archived``, ``lock_expiries``,
    ``group_rebalances``; histograms ``share_fetch_seconds`` and ``ack_latency_seconds``
    (seconds); gauges ``drain_seconds`` (seconds), ``group_members``, ``group_epoch``,
    ``ack_reader_lag_seconds``. The
    share-partition gauges have no attribute: they are read at each scrape from the sources
    given to :meth:`add_partition_source`. KIP-932 has no metric names; they follow the KIP's
    terms (SPSO, SPEO, in-flight) and, where Kafka has an equivalent (KIP-1103, KIP-1226), its
    meaning (docs/operations.md, "Monitoring: metrics", maps them).

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
        self.given_back_unstarted = Counter(
            "queueflow_records_given_back_unstarted",
            "Records released undelivered before their lock expired: at the measured handling "
            "rate no handler would have started them in time",
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
        self.ack_latency_seconds = Histogram(
            "queueflow_acknowledgement_latency_seconds",
            "From the ShareFetch answer that delivered a record to its outcome (share agents)",
            _MEMBER,
            buckets=_ACK_BUCKETS,
            registry=reg,
        )
        self.acquisitions = Counter(
            "queueflow_share_partition_acquisitions",
            "Records acquired (Available -> Acquired)",
            _PARTITION,
            registry=reg,
        )
        self.deliveries = Counter(
            "queueflow_share_partition_deliveries",
            "Records acquired, by the delivery count of that acquisition (1: first delivery)",
            (*_PARTITION, "delivery_count"),
            registry=reg,
        )
        self.archived = Counter(
            "queueflow_share_partition_archived_records",
            "Records moved to Archived (REJECT, GAP, or the delivery count limit)",
            _PARTITION,
            registry=reg,
        )
        self.lock_expiries = Counter(
            "queueflow_share_partition_lock_expiries",
            "Acquired records whose acquisition lock elapsed",
            _PARTITION,
            registry=reg,
        )
        #: Callables the share-partition gauges are read from at each scrape (leaders add
        #: theirs with :meth:`add_partition_source`).
        self.partition_sources: list[SampleSource] = []
        reg.register(_SharePartitionCollector(self.partition_sources))
        self.state_writes = Counter(
            "queueflow_state_writes",
            "Durable state writes (deltas and snapshots)",
            ("topic",),
            registry=reg,
        )
        self.control_messages_dropped = Counter(
            "queueflow_control_messages_dropped",
            "Control messages dropped after a look at their first bytes (junk: an unknown format "
            "or too short), by receiver (leader, coordinator, member)",
            ("receiver", "reason"),
            registry=reg,
        )
        self.transactional_acks = Counter(
            "queueflow_transactional_acks",
            "Transactional acknowledgements applied from the ack topic (exactly_once)",
            ("topic",),
            registry=reg,
        )
        self.dead_letters = Counter(
            "queueflow_dead_letter_records",
            "Records written to a group's dead-letter topic (errors.deadletterqueue.topic.name)",
            ("group", "topic", "dead_letter_topic", "reason"),
            registry=reg,
        )
        self.dead_letter_failures = Counter(
            "queueflow_dead_letter_write_failures",
            "Failed writes to a dead-letter topic; the records stay held and are retried",
            ("group", "topic", "dead_letter_topic"),
            registry=reg,
        )
        self.dead_letter_pending = Gauge(
            "queueflow_dead_letter_pending_records",
            "Records held for the dead-letter topic (Acquired by __dead_letter__)",
            ("group", "topic", "partition"),
            registry=reg,
        )
        self.ack_reader_lag_seconds = Gauge(
            "queueflow_ack_reader_lag_seconds",
            "How far an exactly-once leader's lock clock trails the wall clock (seconds; -1: its "
            "ack reader has not caught up yet)",
            ("topic", "partition"),
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
        self.member_fences = Counter(
            "queueflow_member_fences",
            "Members a leader fenced from a share-partition for abusing it (reason: release, "
            "RELEASEing records without handling them; share.member.release.abuse.*)",
            ("group", "topic", "reason"),
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
            "partition (reason: not_owner), its Faust membership lease lapsed (lease), or "
            "the request's group hashes to another coordinator partition (misrouted)",
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
        self.direct_connections = Gauge(
            "queueflow_direct_connections",
            "Connections the leader's direct endpoint holds now",
            registry=reg,
        )
        self.direct_connections_refused = Counter(
            "queueflow_direct_connections_refused",
            "Direct connections closed at once by a connection cap (reason: max_connections, "
            "max_connections_per_ip)",
            ("reason",),
            registry=reg,
        )
        self.direct_connections_dropped = Counter(
            "queueflow_direct_connections_dropped",
            "Direct connections the endpoint closed (reason: frame_too_large, read_timeout, "
            "unauthenticated_idle, idle, write_timeout, undecodable, tls_mismatch)",
            ("reason",),
            registry=reg,
        )
        self.direct_requests_unserved = Counter(
            "queueflow_direct_requests_unserved",
            "Direct requests refused because the leader's Faust membership lease had lapsed "
            "(reason: lease_acquire, lease_answer)",
            ("reason",),
            registry=reg,
        )
        self.leader_lease_lapses = Counter(
            "queueflow_leader_lease_lapses",
            "Times this worker's Faust membership lease lapsed outside a rebalance (no OK "
            "heartbeat within the session timeout minus one heartbeat interval)",
            registry=reg,
        )
        self.group_members = Gauge(
            "queueflow_share_group_members", "Members per share group", ("group",), registry=reg
        )
        self.group_epoch = Gauge(
            "queueflow_share_group_epoch", "Group epoch", ("group",), registry=reg
        )
        self.group_rebalances = Counter(
            "queueflow_share_group_rebalances",
            "Group epoch bumps: membership or subscriptions changed and assignments were "
            "recomputed (Kafka: share-group-rebalance-count)",
            ("group",),
            registry=reg,
        )

    def add_partition_source(self, source: SampleSource) -> None:
        """Read share-partition gauges from ``source`` at each scrape.

        Args:
            source: returns the :class:`SharePartitionSample` of every share-partition it
                serves now; called on the scraping thread (usually the event loop's, from the
                ``/metrics`` page), so it must not block.
        """
        self.partition_sources.append(source)

    def render(self) -> tuple[bytes, str]:
        """This app's metrics for a ``/metrics`` page.

        Returns:
            ``(body, content_type)``: the Prometheus text exposition of :attr:`registry` and
            :data:`CONTENT_TYPE`.
        """
        return generate_latest(self.registry), CONTENT_TYPE


_PARTITION_GAUGES = (
    ("in_flight_records", "In-flight records: SPEO - SPSO (Kafka: InFlightMessageCount)"),
    ("acquired_records", "Acquired records"),
    ("start_offset", "The SPSO (share-partition start offset)"),
    ("end_offset", "The SPEO (share-partition end offset, exclusive)"),
    ("log_end_offset", "The partition's log end offset (high watermark), as last known"),
    (
        "lag_records",
        "Records not yet delivered to completion: log end - SPSO - Acknowledged - Archived "
        "(KIP-1226 lag)",
    ),
)


class _SharePartitionCollector(Collector):
    """The share-partition gauges, read from the leaders' state at each scrape."""

    def __init__(self, sources: list[SampleSource]) -> None:
        self._sources = sources

    def describe(self) -> Iterable[Metric]:
        return self._families([])  # names only: the registry checks them for duplicates

    def collect(self) -> Iterable[Metric]:
        samples: list[SharePartitionSample] = []
        for source in list(self._sources):
            samples.extend(source())
        return self._families(samples)

    @staticmethod
    def _families(samples: list[SharePartitionSample]) -> list[Metric]:
        labels = list(_PARTITION)
        fams = {
            key: GaugeMetricFamily(f"queueflow_share_partition_{key}", doc, labels=labels)
            for key, doc in _PARTITION_GAUGES
        }
        by_state = GaugeMetricFamily(
            "queueflow_share_partition_records",
            "In-flight records by state (available, acquired, acknowledged, archived)",
            labels=[*labels, "state"],
        )
        for s in samples:
            values = [s.group, s.topic, str(s.partition)]
            fams["in_flight_records"].add_metric(values, s.end_offset - s.start_offset)
            fams["acquired_records"].add_metric(values, s.records.get("acquired", 0))
            fams["start_offset"].add_metric(values, s.start_offset)
            fams["end_offset"].add_metric(values, s.end_offset)
            if s.log_end_offset is not None:
                fams["log_end_offset"].add_metric(values, s.log_end_offset)
            if s.lag is not None:
                fams["lag_records"].add_metric(values, s.lag)
            for state in RECORD_STATES:
                by_state.add_metric([*values, state], s.records.get(state, 0))
        return [*fams.values(), by_state]


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
