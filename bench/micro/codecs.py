"""Codecs: the durable state codec and the wire messages of a ShareFetch.

* ``codec.state.{delta,snapshot}.{encode,decode}``: :mod:`queueflow.protocol.state_codec`
  (version 2, binary), on the shapes of :mod:`bench.bench_state_codec` (S4's: 9 ACCEPTed
  records then one RELEASEd): a delta of 90 runs, a snapshot of 1,000 runs. Decode includes
  validation and building the ``StateBatch`` objects. µs per call.
* ``codec.wire.{request,response}.{json,binary}.{encode,decode}``:
  :mod:`queueflow.protocol.messages`, JSON (the request-topic path) and the binary form (the
  direct path), of a ShareFetch request that acknowledges 500 records in S4's shape (100 runs)
  with a signed assignment ticket and asks for 500 more, and of its response (one acquired
  range). µs per message.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bench.bench_state_codec import START, WHERE, runs
from bench.micro.timing import Result, Sizes, sample, summarize
from queueflow.engine.state import ShareSnapshot, ShareUpdate
from queueflow.protocol import messages as protocol
from queueflow.protocol.auth import issue_ticket
from queueflow.protocol.state_codec import (
    decode_snapshot,
    decode_update,
    encode_snapshot,
    encode_update,
)
from queueflow.structs import AcknowledgeType

__all__ = ["BENCHMARKS", "fetch_request", "fetch_response"]


def _loop(call: Callable[[], object], calls: int) -> Callable[[], None]:
    def run() -> None:
        for _ in range(calls):
            call()

    return run


def bench_state(sizes: Sizes) -> list[Result]:
    update = ShareUpdate(START, runs(90))
    snapshot = ShareSnapshot(41, 3, 12, START, runs(1_000))
    epochs = {"snapshot_epoch": 41, "state_epoch": 3, "delta_index": 17}
    delta_bytes = encode_update(update, **epochs)
    snapshot_bytes = encode_snapshot(snapshot)
    cases: list[tuple[str, int, Callable[[], object]]] = [
        ("delta.encode", 90, lambda: encode_update(update, **epochs)),
        ("delta.decode", 90, lambda: decode_update(delta_bytes, where=WHERE)),
        ("snapshot.encode", 1_000, lambda: encode_snapshot(snapshot)),
        ("snapshot.decode", 1_000, lambda: decode_snapshot(snapshot_bytes, where=WHERE)),
    ]
    out = []
    for name, n_runs, call in cases:
        calls = sizes.calls // (10 if n_runs > 100 else 1) or 1
        samples = sample(_loop(call, calls), units=calls, repeats=sizes.repeats)
        what = f"state codec v2 {name.replace('.', ' ')}, {n_runs} runs"
        out.append(summarize(f"codec.state.{name}", "call", calls, samples, what))
    return out


def fetch_request() -> protocol.ShareFetchRequest:
    """A ShareFetch acknowledging 500 records (runs of 9 ACCEPTed and 1 RELEASEd, 100 runs)
    and asking for 500 more, with a signed assignment ticket."""
    accept, release = int(AcknowledgeType.ACCEPT), int(AcknowledgeType.RELEASE)
    acks: list[protocol.WireAck] = []
    for first in range(START, START + 500, 10):
        acks.append((first, first + 8, (accept,)))
        acks.append((first + 9, first + 9, (release,)))
    ticket = issue_ticket(
        b"k" * 32,
        group="bench",
        member_id="member-0-5c1f0e1a",
        member_epoch=3,
        partitions=[("jobs", p) for p in range(4)],
        ttl_ms=45_000,
        now_ms=1_700_000_000_000,
    )
    return protocol.ShareFetchRequest(
        group="bench",
        topic="jobs",
        partition=0,
        member_id="member-0-5c1f0e1a",
        request_id=123_456,
        reply_partition=2,
        max_records=500,
        acks=acks,
        deadline_ms=1_700_000_030_000,
        max_wait_ms=500,
        ticket=ticket,
    )


def fetch_response() -> protocol.ShareFetchResponse:
    """The answer to :func:`fetch_request`: one acquired range of 500 records."""
    return protocol.ShareFetchResponse(
        member_id="member-0-5c1f0e1a",
        request_id=123_456,
        topic="jobs",
        partition=0,
        acquired=[(START + 500, START + 999, 1)],
        lock_timeout_ms=30_000,
    )


def bench_wire(sizes: Sizes) -> list[Result]:
    out = []
    messages: list[tuple[str, Any]] = [
        ("request", fetch_request()),
        ("response", fetch_response()),
    ]
    formats: list[tuple[str, Callable[[Any], bytes], Callable[[bytes], Any]]] = [
        ("json", protocol.encode, protocol.decode),
        ("binary", protocol.encode_binary, protocol.decode_binary),
    ]
    for kind, message in messages:
        for fmt, encode, decode in formats:
            data = encode(message)
            if decode(data) != message:
                raise AssertionError(f"{kind} {fmt}: the message does not round-trip")
            for op, call in (
                ("encode", lambda e=encode, m=message: e(m)),
                ("decode", lambda d=decode, b=data: d(b)),
            ):
                samples = sample(_loop(call, sizes.calls), units=sizes.calls, repeats=sizes.repeats)
                what = f"ShareFetch {kind} {fmt} {op} ({len(data)} B)"
                name = f"codec.wire.{kind}.{fmt}.{op}"
                out.append(summarize(name, "message", sizes.calls, samples, what))
    return out


#: Name prefix -> the function that runs those benchmarks.
BENCHMARKS: dict[str, Callable[[Sizes], list[Result]]] = {
    "codec.state": bench_state,
    "codec.wire": bench_wire,
}
