"""ACCEPTing what a handler call returned without an outcome per record: the common case of
:meth:`~queueflow.member.agent.runner.HandlerRunner.apply`, done per run of offsets.

The records of a ShareFetch come in offset order and share their delivery time, so their
ACCEPTs are recorded as offset ranges (KIP-932 ``AcknowledgementBatches``, one
:meth:`~queueflow.member.session.ShareFetchSession.acknowledge_range` per run) and their
acknowledgement latency is observed once per delivery time, not once per record. A whole
:class:`~queueflow.member.agent.units.FetchUnit` without a hole is one range, found without a
step per record.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from queueflow.member.agent.results import HandlerResult
from queueflow.member.agent.units import FetchUnit
from queueflow.structs import AcknowledgeType, ShareRecord, TopicPartition

if TYPE_CHECKING:
    from queueflow.member.agent.runner import HandlerRunner

__all__ = ["accept_all", "plain_accepts"]

_ACCEPT = AcknowledgeType.ACCEPT


def accept_all(runner: HandlerRunner, records: Sequence[ShareRecord]) -> None:
    """ACCEPT ``records`` (any order and share-partitions; those of one ShareFetch, in offset
    order, make one range): counted once, their acknowledgement latency observed once per
    delivery time, their offsets recorded as ranges, for ``runner``'s agent."""
    agent = runner.agent
    count = len(records)
    if not count:  # all taken into a transaction (exactly_once)
        return
    runner.ack_counts[_ACCEPT] += count
    agent.stats.accepted += count
    session = agent.session
    now = agent.ctx.clock.monotonic()
    latency = runner.ack_latency
    first = records[0]
    if count == 1:  # a record handler's call
        if first.delivered_at:
            latency.observe(now - first.delivered_at)
        if session is not None:
            offset = first.offset
            session.acks.add_range(
                TopicPartition(first.topic, first.partition), offset, offset, _ACCEPT
            )
        return
    tp = TopicPartition(first.topic, first.partition)
    last = records[-1]
    if (
        type(records) is FetchUnit  # one share-partition, offsets rising (one ShareFetch)
        and last.offset - first.offset + 1 == count  # so: no hole, one run
        and last.delivered_at == first.delivered_at  # rising too: so all read at once
    ):
        if first.delivered_at:
            latency.observe(now - first.delivered_at, count)
        if session is not None:
            session.acknowledge_range(tp, first.offset, last.offset, _ACCEPT)
        return
    run_first = run_last = first.offset
    run_at, run_n = first.delivered_at, 1
    for record in records[1:]:
        if record.delivered_at != run_at:
            if run_at:
                latency.observe(now - run_at, run_n)
            run_at, run_n = record.delivered_at, 0
        run_n += 1
        offset = record.offset
        if offset == run_last + 1 and record.partition == tp[1] and record.topic == tp[0]:
            run_last = offset
            continue
        if session is not None:
            session.acknowledge_range(tp, run_first, run_last, _ACCEPT)
        tp = TopicPartition(record.topic, record.partition)
        run_first = run_last = offset
    if run_at:
        latency.observe(now - run_at, run_n)
    if session is not None:
        session.acknowledge_range(tp, run_first, run_last, _ACCEPT)


def plain_accepts(result: HandlerResult) -> bool:
    """True if ``result`` ACCEPTs each of its records with no option (no delay, no error):
    :func:`accept_all` records it."""
    outcomes = result.outcomes
    if result.delays is not None or len(outcomes) != len(result.records):
        return False
    if len(outcomes) == 1:  # a record handler's call
        return outcomes[0] is _ACCEPT
    return outcomes.count(_ACCEPT) == len(outcomes)  # C speed, identity first
