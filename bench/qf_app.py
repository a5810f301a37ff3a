"""The queueflow share agent under benchmark, run as Faust workers like examples/demo::

    QUEUEFLOW_ROLE=leader|member|all python -m faust -A bench.qf_app --datadir D worker -l info

Configured by the driver (``bench.suite``) through the environment:

==================  ===========================================================================
``BENCH_APP_ID``    queueflow app id (one per benchmark variant)
``BENCH_BROKER``    ``kafka://host:port``
``BENCH_TOPIC``     the source topic
``BENCH_GROUP``     the share group
``BENCH_CONCURRENCY``  handler tasks per process
``BENCH_BATCH``     ``1``: a batch handler (``share_agent(batch=True)``), no-op: counts the
                    batch's records, no Python call per record (mode ``noop`` only)
``BENCH_MODE``      ``noop`` | ``sleep10`` (await 10 ms) | ``release10`` (RELEASE offsets with
                    ``offset % 10 == 0`` on their first delivery) | ``latency`` (no-op, records
                    produce → handler start and produce → acknowledgement answered)
``BENCH_STATS``     stats file (see :class:`bench.harness.Stats`)
``BENCH_GO``        go-file: members fetch nothing before it exists
``BENCH_LEAD_TOPICS``  more source topics to lead (comma-separated; leader processes)
``BENCH_RESULTS_TOPIC``  mode ``results``: the sink topic of one 64-byte result per record
                    (S9), published with ``$QUEUEFLOW_PROCESSING_GUARANTEE``
``BENCH_HEARTBEAT_MS``  the app's ``group.share.heartbeat.interval.ms`` (default 1000)
``BENCH_SAMPLES``   latency mode: where to write the samples (when the driver's stop-file
                    appears, and at exit)
==================  ===========================================================================

Counting without touching queueflow: ``ShareFetchSession._request`` is wrapped in this process.
The wrapper (1) holds fetches that acquire records until the go-file exists (heartbeats are not
held, so members join and get their assignment first) and (2) counts the acknowledgements a
leader answered without ``ack_error``: ACCEPT/REJECT are finished records, RELEASE are counted
apart. The time of that answer is "acknowledged"; it is when the leader has applied the batch and
put the state delta into its table (the changelog write itself is not awaited by the leader).
"""

from __future__ import annotations

import asyncio
import atexit
import inspect
import json
import os
import time
from typing import Any

import queueflow
from bench.harness import Stats, go, stamp_of, wait_go
from queueflow.errors import ErrorCode
from queueflow.member.session import ShareFetchSession

MODE = os.environ.get("BENCH_MODE", "noop")
TOPIC = os.environ["BENCH_TOPIC"]
GROUP = os.environ.get("BENCH_GROUP", "bench")
CONCURRENCY = int(os.environ.get("BENCH_CONCURRENCY", "1"))
BATCH = os.environ.get("BENCH_BATCH", "") == "1"
_NONE = ErrorCode.NONE.value
_ACCEPT = int(queueflow.ACCEPT)
_RELEASE = int(queueflow.RELEASE)
_REJECT = int(queueflow.REJECT)

stats = Stats()
_ROLE = os.environ.get("QUEUEFLOW_ROLE", "all")
if os.environ.get("BENCH_SAMPLE_PROFILE") and _ROLE in os.environ.get(
    "BENCH_SAMPLE_ROLES", _ROLE
).split(","):  # py-spy's stand-in (bench/sampler.py)
    from bench import sampler

    sampler.start(
        os.environ["BENCH_SAMPLE_PROFILE"] + f".{_ROLE}.{os.getpid()}",
        float(os.environ.get("BENCH_SAMPLE_INTERVAL_MS", "5")) / 1000,
    )
_go_seen = go()
#: latency mode: (partition, offset) -> produce time of records handled, not yet acknowledged.
_started: dict[tuple[int, int], float] = {}
_to_handler: list[float] = []
_to_handler_ts: list[float] = []
#: (produced at, s since epoch; partition; offset; delivery count) per _to_handler sample: the
#: report places the slow ones in time and in the log
_to_handler_where: list[tuple[float, int, int, int]] = []
_to_ack: list[float] = []
_to_ack_produced: list[float] = []  # produce time of each _to_ack sample (S3 keeps a window)

app = queueflow.App(
    os.environ["BENCH_APP_ID"],
    broker=os.environ["BENCH_BROKER"],
    share_settings={
        "share.auto.offset.reset": "earliest",
        "group.share.heartbeat.interval.ms": int(os.environ.get("BENCH_HEARTBEAT_MS", "1000")),
        "group.share.session.timeout.ms": 15000,
    },
)
source = app.topic(TOPIC, key_serializer="raw", value_serializer="raw")

_original_request = ShareFetchSession._request
_original_read = ShareFetchSession._read


class _Timings:
    """Where a member's and a leader's time goes, per request (never per record)."""

    def __init__(self) -> None:
        self.fetch_rtt: list[float] = []  # ShareFetch with max_records > 0: request -> response
        self.ack_rtt: list[float] = []  # ShareAcknowledge (max_records == 0)
        self.acquired: list[int] = []  # records acquired per ShareFetch
        self.wanted: list[int] = []  # max_records asked per ShareFetch
        self.read: list[float] = []  # read_records (payloads from the source topic)
        self.leader_service: list[float] = []  # leader: one request event, decode to reply sent
        self.leader_transit: list[float] = []  # leader: request created -> leader handles it
        self.leader_events = 0
        self._cached: tuple[float, dict[str, Any]] = (0.0, {})

    def summary(self) -> dict[str, Any]:
        """Summaries, recomputed at most every 2 s (the stats thread calls this often)."""
        at, cached = self._cached
        if time.monotonic() - at < 2.0 and cached:
            return cached
        self._cached = (time.monotonic(), self._summary())
        return self._cached[1]

    def _summary(self) -> dict[str, Any]:
        def ms(values: list[float]) -> dict[str, float] | None:
            if not values:
                return None
            ordered = sorted(values)
            return {
                "n": len(ordered),
                "mean": round(1000 * sum(ordered) / len(ordered), 2),
                "p50": round(1000 * ordered[len(ordered) // 2], 2),
                "p99": round(1000 * ordered[min(int(0.99 * len(ordered)), len(ordered) - 1)], 2),
            }

        acquired = self.acquired
        return {
            "fetch_rtt_ms": ms(self.fetch_rtt),
            "ack_rtt_ms": ms(self.ack_rtt),
            "read_ms": ms(self.read),
            "acquired_per_fetch": round(sum(acquired) / len(acquired), 1) if acquired else None,
            "wanted_per_fetch": round(sum(self.wanted) / len(self.wanted), 1)
            if self.wanted
            else None,
            "empty_fetches": sum(1 for a in acquired if a == 0),
            "leader_service_ms": ms(self.leader_service),
            "leader_transit_ms": ms(self.leader_transit),
            "leader_events": self.leader_events,
        }


timings = _Timings()


_REQUEST_SIGNATURE = inspect.signature(_original_request)


def _hook_failed(where: str, exc: BaseException) -> None:
    """The hooks wrap queueflow internals, which change: say so in the stats, never break."""
    stats.extra.setdefault("hook_errors", {})[where] = repr(exc)[:300]


async def _request(self: ShareFetchSession, *args: Any, **kwargs: Any) -> Any:
    global _go_seen
    try:
        call = _REQUEST_SIGNATURE.bind(self, *args, **kwargs).arguments
        partition, max_records = call["tp"][1], call["max_records"]
        acks = call.get("acks") or []
    except Exception as exc:  # a new signature: pass through, uncounted
        _hook_failed("ShareFetchSession._request", exc)
        return await _original_request(self, *args, **kwargs)
    if max_records > 0 and not _go_seen:
        # which event loop runs this worker (asyncio's or uvloop's: Faust's -L)
        stats.extra["loop"] = type(asyncio.get_running_loop()).__module__
        await wait_go()
        _go_seen = True
    sent = time.monotonic()
    result = await _original_request(self, *args, **kwargs)
    # _request returns (response, came over the direct path) since control plane v2.
    response = result[0] if isinstance(result, tuple) else result
    try:
        _count(response, partition, max_records, acks, time.monotonic() - sent)
    except Exception as exc:
        _hook_failed("count acknowledgements", exc)
    return result


def _count(response: Any, partition: int, max_records: int, acks: list[Any], rtt: float) -> None:
    if max_records > 0:
        timings.fetch_rtt.append(rtt)
        timings.wanted.append(max_records)
        timings.acquired.append(sum(b - a + 1 for a, b, _ in response.acquired))
    else:
        timings.ack_rtt.append(rtt)
    if not acks or response.ack_error != _NONE:
        return
    now = time.time()
    finished = 0
    for first, last, types in acks:
        if len(types) == 1 and MODE != "latency":  # one type for the range: no loop per record
            if types[0] in (_ACCEPT, _REJECT):
                finished += last - first + 1
            elif types[0] == _RELEASE:
                stats.released += last - first + 1
            continue
        kinds = [types[0]] * (last - first + 1) if len(types) == 1 else list(types)
        for i, kind in enumerate(kinds):
            if kind in (_ACCEPT, _REJECT):
                finished += 1
                if MODE == "latency":
                    produced = _started.pop((partition, first + i), None)
                    if produced is not None:
                        _to_ack.append(now - produced)
                        _to_ack_produced.append(produced)
            elif kind == _RELEASE:
                stats.released += 1
    if finished:
        stats.done += finished
        stats.last = now


async def _read(self: ShareFetchSession, *args: Any, **kwargs: Any) -> Any:
    started = time.monotonic()
    try:
        return await _original_read(self, *args, **kwargs)
    finally:
        timings.read.append(time.monotonic() - started)


ShareFetchSession._request = _request  # type: ignore[method-assign]
ShareFetchSession._read = _read  # type: ignore[method-assign]


def _time_leader() -> None:
    """In leader processes: time each request event and the request's trip to the leader."""
    from queueflow.server.leader import ShareLeader

    handle, share_fetch = ShareLeader._handle, ShareLeader._share_fetch
    apply_batch = ShareLeader._apply_batch

    async def _apply_batch_timed(self: ShareLeader, partition: int, items: Any) -> Any:
        # The direct path: one service time per batch of requests, one event per request.
        started = time.monotonic()
        try:
            return await apply_batch(self, partition, items)
        finally:
            timings.leader_service.append(time.monotonic() - started)
            timings.leader_events += len(items)

    async def _handle(self: ShareLeader, *args: Any, **kwargs: Any) -> Any:
        started = time.monotonic()
        try:
            return await handle(self, *args, **kwargs)
        finally:
            timings.leader_service.append(time.monotonic() - started)
            timings.leader_events += 1

    async def _share_fetch_timed(self: ShareLeader, request: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            created_ms = request.deadline_ms - self.ctx.settings.request_timeout_ms
            timings.leader_transit.append(max(time.time() * 1000 - created_ms, 0) / 1000)
        except Exception as exc:
            _hook_failed("ShareLeader._share_fetch", exc)
        return await share_fetch(self, request, *args, **kwargs)

    ShareLeader._handle = _handle  # type: ignore[method-assign]
    ShareLeader._share_fetch = _share_fetch_timed  # type: ignore[method-assign]
    ShareLeader._apply_batch = _apply_batch_timed  # type: ignore[method-assign]


if os.environ.get("QUEUEFLOW_ROLE", "all") != "member":
    _time_leader()


RESULTS_TOPIC = os.environ.get("BENCH_RESULTS_TOPIC")
results = (
    app.topic(RESULTS_TOPIC, key_serializer="raw", value_serializer="raw")
    if RESULTS_TOPIC
    else None
)


async def handle_batch(records: list[queueflow.ShareRecord]) -> None:
    """The batch variant: count the batch, nothing per record."""
    if stats.first is None:
        stats.first = time.time()
    stats.delivered += len(records)


async def handle(record: queueflow.ShareRecord) -> Any:
    if MODE == "noop":
        stats.delivery()
        return None
    if MODE == "results":
        stats.delivery()
        return queueflow.Result(queueflow.ACCEPT, [record.value[:64]])
    now = time.time()
    stats.delivery(now)
    if MODE == "sleep10":
        await asyncio.sleep(0.01)
        return None
    if MODE == "release10":
        if record.delivery_count == 1 and record.offset % 10 == 0:
            return queueflow.RELEASE
        return None
    if MODE == "latency":
        produced = stamp_of(record.value)
        _to_handler.append(now - produced)
        _to_handler_where.append((produced, record.partition, record.offset, record.delivery_count))
        _to_handler_ts.append(now - record.timestamp / 1000)
        _started[(record.partition, record.offset)] = produced
        return None
    raise RuntimeError(f"unknown BENCH_MODE {MODE!r}")


if BATCH and MODE != "noop":
    raise RuntimeError(f"BENCH_BATCH=1 needs BENCH_MODE=noop, not {MODE!r}")
agent = app.share_agent(
    source,
    group=GROUP,
    concurrency=CONCURRENCY,
    batch=BATCH,
    sink=[results] if results is not None else None,
)(handle_batch if BATCH else handle)


for _extra in filter(None, os.environ.get("BENCH_LEAD_TOPICS", "").split(",")):
    app.share_groups.lead(_extra)  # leader processes of S2 lead one topic per run


if app.share_groups.role == "leader":
    # Faust internals are read in the event loop (a timer), never from the stats thread: some
    # are created lazily, and creating them from another thread breaks the worker.
    @app.timer(0.2)
    async def _leader_probe() -> None:
        fetch_topics = {leader.request_topic for leader in app.share_groups.leaders.values()}
        owned = [tp for tp in app.assignor.assigned_actives() if tp.topic in fetch_topics]
        recovered = app.tables.recovery.completed.is_set() and not app.rebalancing
        stats.extra.update(leader=True, owned=len(owned), recovered=recovered)


def _probe() -> dict[str, Any]:
    if app.share_groups.role == "leader":
        return {"timings": timings.summary()}
    session = agent.session
    assigned = sorted(p for _t, p in session.assignment) if session is not None else []
    return {
        "assigned": assigned,
        "ready": bool(assigned),
        "role": app.share_groups.role,
        "timings": timings.summary(),
    }


stats.probe = _probe
stats.start()


def _write_samples() -> None:
    path = os.environ.get("BENCH_SAMPLES")
    if path and MODE == "latency":
        with open(path, "w") as f:
            json.dump(
                {
                    "to_handler": _to_handler,
                    "to_handler_record_ts": _to_handler_ts,
                    "to_ack": _to_ack,
                    "to_ack_produced": _to_ack_produced,
                    "to_handler_where": _to_handler_where,
                },
                f,
            )


stats.on_stop_file = _write_samples
atexit.register(_write_samples)
