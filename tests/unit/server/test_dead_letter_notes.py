"""The pure parts of dead-letter topics (docs/guide.md "Dead-letter topics"): the leader's notes
of why records were REJECTed or RELEASEd, the reason header, the DLQ record's headers and key
and value, reading a DLQ record's source back (redrive), and the members' errors."""

from __future__ import annotations

from queueflow.engine.partition import SharePartition, SharePartitionConfig
from queueflow.member.acks import AcknowledgementBuffer
from queueflow.protocol import messages as protocol
from queueflow.protocol.dead_letters import (
    HEADER_PREFIX,
    SourceRecord,
    dead_letter_record,
    source_of,
)
from queueflow.server.leader.dead_letter_notes import (
    DeadLetterNote,
    DeadLetterNotes,
    dead_letter_reason,
)
from queueflow.structs import AcknowledgeType, TopicPartition

A = AcknowledgeType
BOOM = protocol.AckError(type="RuntimeError", message="boom")


def request(
    acks: list[protocol.WireAck], errors: list[tuple[int, int, protocol.AckError]] | None = None
) -> protocol.ShareFetchRequest:
    return protocol.ShareFetchRequest(
        group="g",
        topic="t",
        partition=0,
        member_id="m",
        request_id=1,
        reply_partition=0,
        max_records=0,
        acks=acks,
        ack_errors=errors or [],
    )


def test_notes_keep_the_last_reject_or_failed_release_per_offset() -> None:
    engine = SharePartition(SharePartitionConfig(dead_letter=True), 0)
    notes = DeadLetterNotes()
    notes.remember("g", 0, request([(0, 1, (int(A.RELEASE),))], [(0, 1, BOOM)]), engine)
    assert notes.note("g", 0, 1) == DeadLetterNote(False, BOOM)
    notes.remember("g", 0, request([(1, 1, (int(A.REJECT),))]), engine)
    assert notes.note("g", 0, 1) == DeadLetterNote(True, None)
    notes.remember("g", 0, request([(0, 0, (int(A.ACCEPT),))]), engine)
    assert notes.note("g", 0, 0) is None  # an ACCEPT forgets
    notes.forget("g", 0, 0, 5)
    assert len(notes) == 0


def test_notes_cost_nothing_without_rejects_or_errors() -> None:
    engine = SharePartition(SharePartitionConfig(dead_letter=True), 0)
    notes = DeadLetterNotes()
    notes.remember("g", 0, request([(0, 999, (int(A.ACCEPT),))]), engine)
    notes.remember("g", 0, request([(0, 999, (int(A.RELEASE),))]), engine)
    assert len(notes) == 0


def test_reasons() -> None:
    undecodable = protocol.AckError(message="bad header", reason="undecodable")
    assert dead_letter_reason(DeadLetterNote(True, undecodable), 1, 5) == "undecodable"
    assert dead_letter_reason(DeadLetterNote(True, None), 5, 5) == "rejected"
    assert dead_letter_reason(DeadLetterNote(False, BOOM), 5, 5) == "delivery_limit"
    # No note (a new leader): from the delivery count.
    assert dead_letter_reason(None, 5, 5) == "delivery_limit"
    assert dead_letter_reason(None, 2, 5) == "rejected"


def test_dead_letter_record_headers_and_copy() -> None:
    source = SourceRecord(7, b"k", b"v", (("app", b"1"), (HEADER_PREFIX + "reason", b"old")))
    fields = dict(group="g", topic="t", partition=2, offset=7, delivery_count=3)
    copied = dead_letter_record(
        source, **fields, reason="delivery_limit", error=BOOM, copy_record=True
    )
    assert (copied.key, copied.value) == (b"k", b"v")
    assert copied.headers == (
        ("app", b"1"),  # the source's own headers; its old dead-letter ones are replaced
        (HEADER_PREFIX + "group", b"g"),
        (HEADER_PREFIX + "topic", b"t"),
        (HEADER_PREFIX + "partition", b"2"),
        (HEADER_PREFIX + "offset", b"7"),
        (HEADER_PREFIX + "delivery_count", b"3"),
        (HEADER_PREFIX + "reason", b"delivery_limit"),
        (HEADER_PREFIX + "exception.type", b"RuntimeError"),
        (HEADER_PREFIX + "exception.message", b"boom"),
    )
    plain = dead_letter_record(source, **fields, reason="rejected", error=None, copy_record=False)
    assert (plain.key, plain.value) == (None, b"")  # a producer needs a key or a value
    assert not any(name.startswith(HEADER_PREFIX + "exception") for name, _ in plain.headers)
    gone = dead_letter_record(None, **fields, reason="rejected", error=None, copy_record=True)
    assert gone.value == b"" and len(gone.headers) == 6
    assert source_of(copied.headers) == ("t", 2, 7)
    assert source_of([("app", b"1")]) is None
    assert source_of([(HEADER_PREFIX + "topic", b"t"), (HEADER_PREFIX + "partition", b"x")]) is None


def test_ack_error_of_an_exception_is_cut() -> None:
    class Custom(Exception):
        pass

    error = protocol.AckError.of(Custom("x" * 5000))
    assert error.type.endswith("test_ack_error_of_an_exception_is_cut.<locals>.Custom")
    assert len(error.message) == protocol.ACK_ERROR_MESSAGE_MAX
    assert protocol.AckError.of(ValueError("v")).type == "ValueError"


def test_member_buffer_sends_errors_with_their_acknowledgements() -> None:
    tp = TopicPartition("t", 0)
    buffer = AcknowledgementBuffer()
    buffer.add(tp, 3, A.RELEASE, BOOM)
    buffer.add(tp, 4, A.RELEASE, BOOM)
    buffer.add(tp, 5, A.ACCEPT)
    acks = buffer.take(tp)
    assert buffer.errors_for(tp, acks) == [(3, 4, BOOM)]
    buffer.add(tp, 4, A.ACCEPT)  # a later outcome without an error clears it
    assert buffer.errors_for(tp, [(3, 5, (1,))]) == [(3, 3, BOOM)]
    assert buffer.errors_for(TopicPartition("t", 1), acks) == []
