"""What the leaders' durable state says, replayed from their topics after a run.

* :func:`settle`: the share-partition state of ids the ledger leaves open (from the state
  changelog);
* :func:`replay_diagnostics`: ShareFetch requests answered more than once (from the request and
  reply topics).
"""

from __future__ import annotations

import asyncio
import bisect
import json
import time
from collections import Counter, defaultdict

from aiokafka import AIOKafkaConsumer, TopicPartition

from examples.chaos.config import ChaosConfig
from queueflow.engine.state import RecordState
from queueflow.protocol.state_codec import decode_snapshot, decode_update

__all__ = ["ARCHIVED_AT_LIMIT", "leader_view", "replay_diagnostics", "settle"]


async def leader_view(
    bootstrap: str,
    changelog: str,
    group: str,
    partitions: int,
    targets: dict[int, list[int]],
    timeout_s: float = 60.0,
) -> tuple[dict[tuple[int, int], tuple[int, int]], dict[int, int]]:
    """Replay the share-partition state of ``group`` from ``changelog`` for the ``targets``
    (partition -> sorted offsets).

    Returns:
        ((partition, offset) -> (last persisted state, delivery count) for the targets that were
        ever in persisted state, partition -> final SPSO).
    """
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest"
    )
    await consumer.start()
    states: dict[tuple[int, int], tuple[int, int]] = {}
    spso: dict[int, int] = {}
    try:
        tps = [TopicPartition(changelog, p) for p in range(partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        deadline = time.monotonic() + timeout_s
        done = {tp for tp in tps if ends[tp] == 0}
        while len(done) < len(tps) and time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=500, max_records=5000)
            for tp, messages in batch.items():
                for m in messages:
                    if m.offset + 1 >= ends[tp]:
                        done.add(tp)
                    if m.key is None or m.value is None:
                        continue
                    key = m.key.decode(errors="replace").split("/")
                    if len(key) < 3 or key[1] != group:
                        continue
                    p = int(key[2])
                    offs = targets.get(p, [])
                    if key[0] == "S":
                        snap = decode_snapshot(m.value, where=changelog)
                        start, batches, full = snap.start_offset, snap.batches, True
                    elif key[0] == "D":
                        upd, *_ = decode_update(m.value, where=changelog)
                        start, batches, full = upd.start_offset, upd.batches, upd.reset
                    else:
                        continue
                    spso[p] = start
                    if full:  # a snapshot replaces everything from its SPSO on
                        for o in offs[bisect.bisect_left(offs, start) :]:
                            states[(p, o)] = (int(RecordState.AVAILABLE), 0)
                    for b in batches:
                        lo = bisect.bisect_left(offs, b.first_offset)
                        hi = bisect.bisect_right(offs, b.last_offset)
                        for o in offs[lo:hi]:
                            states[(p, o)] = (int(b.state), int(b.delivery_count))
    finally:
        await consumer.stop()
    return states, spso


#: What the leaders' state says about a record the ledger leaves open (see :func:`settle`).
ARCHIVED_AT_LIMIT = "archived_at_limit"


def settle(
    bootstrap: str,
    app_id: str,
    topic: str,
    config: ChaosConfig,
    where: list[tuple[int, int]],
    ids: set[int],
) -> dict[int, str]:
    """What the leaders' durable state says about ``ids``, replayed from the state changelog.

    Returns id -> status for the ids the leaders are done with:

    * ``archived_at_limit``: Archived, or passed by the SPSO, with delivery count >= the limit;
    * ``archived_below_limit``: Archived with a lower count (a GAP acknowledgement?);
    * ``acknowledged``: Acknowledged;
    * ``passed_below_limit``: passed by the SPSO while last persisted as Available/Acquired
      below the limit, or never persisted at all.

    Ids still in flight (or beyond the SPEO) are left out.
    """
    targets: dict[int, list[int]] = defaultdict(list)
    by_place = {}
    for record_id in ids:
        p, o = where[record_id]
        targets[p].append(o)
        by_place[(p, o)] = record_id
    for offs in targets.values():
        offs.sort()
    changelog = f"{app_id}-share-state-{topic}-changelog"
    states, spso = asyncio.run(
        leader_view(bootstrap, changelog, "chaos", config.partitions, dict(targets))
    )
    limit = config.delivery_limit
    out: dict[int, str] = {}
    for (p, o), record_id in by_place.items():
        state, count = states.get((p, o), (int(RecordState.AVAILABLE), 0))
        passed = o < spso.get(p, -1)
        if state == RecordState.ACKNOWLEDGED:
            out[record_id] = "acknowledged"
        elif state == RecordState.ARCHIVED or passed:
            if count >= limit:
                out[record_id] = ARCHIVED_AT_LIMIT
            elif state == RecordState.ARCHIVED:
                out[record_id] = "archived_below_limit"
            else:
                out[record_id] = "passed_below_limit"
    return out


async def replay_diagnostics(
    bootstrap: str, app_id: str, topic: str, request_timeout_ms: int, timeout_s: float = 60.0
) -> dict[str, int]:
    """Count ShareFetch requests the leaders answered more than once, from the request and reply
    topics: a leader that processes a request again (Faust re-delivers it after a rebalance)
    before its ``deadline_ms`` acquires records for a member that is no longer waiting for that
    answer. Those records stay Acquired until their lock expires, and their delivery count goes
    up without a delivery."""
    requests: dict[tuple[str, int, int], int] = {}
    answers: dict[tuple[str, int, int], list[tuple[int, int]]] = defaultdict(list)
    for name in (f"{app_id}-share-fetch-{topic}", f"{app_id}-share-replies"):
        consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest"
        )
        await consumer.start()
        try:
            parts = consumer.partitions_for_topic(name) or set()
            if not parts:
                await consumer._client.force_metadata_update()
                parts = consumer.partitions_for_topic(name) or set()
            tps = [TopicPartition(name, p) for p in sorted(parts)]
            if not tps:
                continue
            consumer.assign(tps)
            await consumer.seek_to_beginning(*tps)
            ends = await consumer.end_offsets(tps)
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                positions = [await consumer.position(tp) for tp in tps]
                if all(pos >= ends[tp] for pos, tp in zip(positions, tps, strict=True)):
                    break
                batch = await consumer.getmany(timeout_ms=500, max_records=10000)
                for messages in batch.values():
                    for m in messages:
                        if not m.value:
                            continue
                        try:
                            v = json.loads(m.value)
                        except ValueError:
                            continue
                        kind = v.get("kind")
                        if kind == "fetch" and v.get("max_records", 0) > 0:
                            requests[(v["member_id"], v["request_id"], m.partition)] = m.timestamp
                        elif kind == "fetch_response":
                            n = sum(last - first + 1 for first, last, _ in v.get("acquired", []))
                            key = (v["member_id"], v["request_id"], v["partition"])
                            answers[key].append((m.timestamp, n))
        finally:
            await consumer.stop()
    out = Counter(fetch_requests=len(requests), fetch_answers=sum(map(len, answers.values())))
    for key, got in answers.items():
        got.sort()
        if len(got) > 1:
            out["requests_answered_again"] += 1
            phantom = sum(n for _t, n in got[1:])
            if phantom:
                out["answers_again_acquiring"] += 1
                out["records_acquired_again"] += phantom
        sent = requests.get(key)
        if sent is not None and got[0][0] - sent > request_timeout_ms and got[0][1]:
            out["late_answers_acquiring"] += 1
            out["records_acquired_late"] += got[0][1]
    return dict(out)
