"""Stateful property test: the run-based engine against a naive per-record model of KIP-932.

The model keeps ``offset -> [state, delivery count, owner, lock deadline]`` for every in-flight
offset and implements the rules in the most direct way. Hypothesis drives both with random
acquires (several members, random ``max_records``, a growing log end, consumer lock durations),
valid and invalid acknowledgements, member releases, clock advances with lock expiry, admin
resets and durable-state takes, and checks after every step that they agree on everything
observable, that the durable form restores, and that replaying every ``take_changes()`` gives
``snapshot()``.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
)

from queueflow.engine import (
    AcknowledgementBatch,
    AcknowledgeType,
    RecordState,
    RecordView,
    SharePartition,
    SharePartitionConfig,
    ShareSnapshot,
    ShareUpdate,
    StateBatch,
    merge_batches,
    replay,
)
from queueflow.errors import InvalidRecordStateError, InvalidRequestError
from queueflow.protocol.state_codec import decode_update, encode_update

AV = RecordState.AVAILABLE
AQ = RecordState.ACQUIRED
AK = RecordState.ACKNOWLEDGED
AR = RecordState.ARCHIVED
MEMBERS = ("m1", "m2", "m3")


class Model:
    """KIP-932 for one share-partition, one record at a time."""

    def __init__(self, cfg: SharePartitionConfig, start: int) -> None:
        self.cfg = cfg
        self.spso = start
        self.speo = start
        self.recs: dict[int, list[Any]] = {}  # offset -> [state, count, owner, deadline]

    def view(self, o: int) -> RecordView:
        if o < self.spso:
            return RecordView(AR, 0, None, None)
        if o >= self.speo:
            return RecordView(AV, 0, None, None)
        s, c, m, d = self.recs[o]
        return RecordView(s, c, m, d)

    def advance(self) -> None:
        while self.spso < self.speo and self.recs[self.spso][0] in (AK, AR):
            del self.recs[self.spso]
            self.spso += 1

    def release(self, o: int) -> None:
        rec = self.recs[o]
        rec[0] = AR if rec[1] >= self.cfg.delivery_count_limit else AV
        rec[2] = rec[3] = None

    def acquire(
        self, member: str, max_records: int, leo: int, now: int, dur: int | None
    ) -> list[tuple[int, int]]:
        if max_records < 1 or (dur is not None and not 1000 <= dur <= 60000):
            raise InvalidRequestError("model")
        deadline = now + (dur if dur is not None else self.cfg.record_lock_duration_ms)
        got: list[tuple[int, int]] = []
        for o in range(self.spso, self.speo):
            if len(got) == max_records:
                break
            rec = self.recs[o]
            if rec[0] is AV:
                rec[:] = [AQ, rec[1] + 1, member, deadline]
                got.append((o, rec[1]))
        stop = min(
            max(leo, self.speo),
            self.spso + self.cfg.max_in_flight_records,
            self.speo + max_records - len(got),
        )
        for o in range(self.speo, stop):
            self.recs[o] = [AQ, 1, member, deadline]
            got.append((o, 1))
        self.speo = max(self.speo, stop)
        return got

    def acknowledge(
        self,
        member: str,
        batches: list[AcknowledgementBatch],
        now: int = 0,
        dur: int | None = None,
    ) -> None:
        prev = None
        for b in batches:
            n = b.last_offset - b.first_offset + 1
            if (
                b.first_offset > b.last_offset
                or (prev is not None and b.first_offset <= prev)
                or b.first_offset < 0
                or b.last_offset >= self.speo
                or len(b.acknowledge_types) not in (1, n)
            ):
                raise InvalidRequestError("model")
            prev = b.last_offset
        for b in batches:
            for o in range(max(b.first_offset, self.spso), b.last_offset + 1):  # below: skipped
                rec = self.recs[o]
                if rec[0] is not AQ or rec[2] != member:
                    raise InvalidRecordStateError("model")
        # A batch wholly below the SPSO is skipped, its RENEW too (as Kafka's broker skips it).
        renews = any(
            AcknowledgeType.RENEW in b.acknowledge_types and b.last_offset >= self.spso
            for b in batches
        )
        if renews and dur is not None and not 1000 <= dur <= 60000:
            raise InvalidRequestError("model")
        renewed = now + (dur if dur is not None else self.cfg.record_lock_duration_ms)
        for b in batches:
            types = b.acknowledge_types
            for k, o in enumerate(range(b.first_offset, b.last_offset + 1)):
                if o < self.spso:  # as Kafka 4.3: finished already, skipped
                    continue
                t = types[0] if len(types) == 1 else types[k]
                rec = self.recs[o]
                if t is AcknowledgeType.ACCEPT:
                    rec[:] = [AK, rec[1], None, None]
                elif t is AcknowledgeType.RELEASE:
                    self.release(o)
                elif t is AcknowledgeType.RENEW:  # KIP-1222: still Acquired, a new lock
                    rec[3] = renewed
                else:  # REJECT, GAP
                    rec[:] = [AR, rec[1], None, None]
        self.advance()

    def release_member(self, member: str) -> int:
        n = 0
        for o, rec in self.recs.items():
            if rec[0] is AQ and rec[2] == member:
                self.release(o)
                n += 1
        self.advance()
        return n

    def expire(self, now: int) -> int:
        n = 0
        for o, rec in self.recs.items():
            if rec[0] is AQ and rec[3] <= now:
                self.release(o)
                n += 1
        self.advance()
        return n

    def reset(self, offset: int) -> None:
        if any(rec[0] is AQ for rec in self.recs.values()):
            raise InvalidRequestError("model")
        self.recs.clear()
        self.spso = self.speo = offset

    def persisted(self) -> tuple[int, tuple[StateBatch, ...]]:
        out = []
        for o in range(self.spso, self.speo):
            s, c, member, deadline = self.recs[o]
            if s is AV and c == 0:
                continue
            # Acquired is persisted with its lock (owner and deadline).
            out.append(StateBatch(o, o, s, c, member, deadline))
        return self.spso, merge_batches(out)


class ShareMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 0
        self.leo = 0

    @initialize(
        limit=st.sampled_from([2, 3, 5]),
        max_in_flight=st.sampled_from([100, 130]),
        start=st.integers(0, 10**6),
    )
    def setup(self, limit: int, max_in_flight: int, start: int) -> None:
        self.cfg = SharePartitionConfig(
            max_in_flight_records=max_in_flight, delivery_count_limit=limit
        )
        self.sp = SharePartition(self.cfg, start)
        self.model = Model(self.cfg, start)
        self.leo = start
        self.base = ShareSnapshot(0, 0, 0, start, ())
        self.updates: list[ShareUpdate] = []

    def same_error(self, engine_call: Any, model_call: Any) -> Any:
        """Run both; they must both succeed or raise the same error class (engine unchanged)."""
        before = (self.sp.start_offset, self.sp.end_offset, tuple(self.sp.in_flight()))
        try:
            expected = model_call()
        except (InvalidRequestError, InvalidRecordStateError) as exc:
            with pytest.raises(type(exc)):
                engine_call()
            assert (self.sp.start_offset, self.sp.end_offset, tuple(self.sp.in_flight())) == before
            return None
        return expected, engine_call()

    # -- rules ---------------------------------------------------------------------------------

    @rule(
        member=st.sampled_from(MEMBERS),
        max_records=st.integers(1, 60),
        grow=st.integers(0, 70),
        dur=st.sampled_from([None, None, 1000, 1500, 30000, 60000]),
    )
    def acquire(self, member: str, max_records: int, grow: int, dur: int | None) -> None:
        self.leo += grow
        got = self.sp.acquire(member, max_records, self.leo, self.now, dur)
        expected = self.model.acquire(member, max_records, self.leo, self.now, dur)
        flat = [
            (o, r.delivery_count) for r in got for o in range(r.first_offset, r.last_offset + 1)
        ]
        assert flat == expected
        for a, b in itertools.pairwise(got):  # ranges are maximal and ordered
            assert a.last_offset < b.first_offset
            assert a.last_offset + 1 < b.first_offset or a.delivery_count != b.delivery_count

    @rule(max_records=st.integers(-2, 0), dur=st.sampled_from([None, 999, 60001]))
    def acquire_invalid(self, max_records: int, dur: int | None) -> None:
        self.same_error(
            lambda: self.sp.acquire("m1", max_records, self.leo + 10, self.now, dur),
            lambda: self.model.acquire("m1", max_records, self.leo + 10, self.now, dur),
        )

    @rule(member=st.sampled_from(MEMBERS), data=st.data())
    def acknowledge_owned(self, member: str, data: st.DataObject) -> None:
        """Mostly valid: contiguous pieces of the member's own Acquired records."""
        owned = sorted(o for o, r in self.model.recs.items() if r[0] is AQ and r[2] == member)
        segments: list[list[int]] = []
        for o in owned:
            if segments and segments[-1][-1] + 1 == o:
                segments[-1].append(o)
            else:
                segments.append([o])
        batches: list[AcknowledgementBatch] = []
        for seg in segments:
            if not data.draw(st.booleans()):
                continue
            i = data.draw(st.integers(0, len(seg) - 1))
            j = data.draw(st.integers(i, len(seg) - 1))
            n = j - i + 1
            if data.draw(st.booleans()):
                types = (data.draw(st.sampled_from(AcknowledgeType)),)
            else:
                types = tuple(
                    data.draw(st.lists(st.sampled_from(AcknowledgeType), min_size=n, max_size=n))
                )
            batches.append(AcknowledgementBatch(seg[i], seg[j], types))
        spoil = data.draw(st.integers(0, 12))  # sometimes spoil one part of the request
        if spoil == 0:
            batches.append(self.draw_batch(data))
        elif spoil == 1 and batches:  # overlaps the previous batch by exactly one offset
            last = batches[-1].last_offset
            batches.append(AcknowledgementBatch(last, last + 1, (AcknowledgeType.ACCEPT,)))
        elif spoil == 2 and len(batches) > 1:  # unordered
            batches.reverse()
        dur = data.draw(st.sampled_from([None, None, None, 1000, 45000, 999]))
        self.same_error(
            lambda: self.sp.acknowledge(member, batches, self.now, dur),
            lambda: self.model.acknowledge(member, batches, self.now, dur),
        )

    def draw_batch(self, data: st.DataObject) -> AcknowledgementBatch:
        first = data.draw(st.integers(self.model.spso - 3, self.model.speo + 2))
        last = first + data.draw(st.integers(-1, 6))
        ntypes = data.draw(st.sampled_from([0, 1, 1, max(last - first + 1, 0), 2]))
        types = tuple(
            data.draw(st.lists(st.sampled_from(AcknowledgeType), min_size=ntypes, max_size=ntypes))
        )
        return AcknowledgementBatch(first, last, types)

    @rule(member=st.sampled_from(MEMBERS), data=st.data())
    def acknowledge_random(self, member: str, data: st.DataObject) -> None:
        """Mostly invalid: random ranges around the in-flight window."""
        batches = [self.draw_batch(data) for _ in range(data.draw(st.integers(1, 3)))]
        if data.draw(st.booleans()):
            batches.sort(key=lambda b: b.first_offset)
        self.same_error(
            lambda: self.sp.acknowledge(member, batches, self.now),
            lambda: self.model.acknowledge(member, batches, self.now),
        )

    @rule(member=st.sampled_from((*MEMBERS, "ghost")))
    def release_member(self, member: str) -> None:
        assert self.sp.release_member(member, self.now) == self.model.release_member(member)

    @rule(step=st.integers(0, 40000))
    def tick(self, step: int) -> None:
        self.now += step
        assert self.sp.expire_locks(self.now) == self.model.expire(self.now)

    @rule(offset=st.sampled_from([-1, 0, 0, 1]))
    def tick_to_next_deadline(self, offset: int) -> None:
        """Expire exactly at (or 1 ms around) the earliest lock deadline."""
        deadline = self.sp.next_lock_deadline()
        if deadline is not None:
            self.now = max(self.now, deadline + offset)
        assert self.sp.expire_locks(self.now) == self.model.expire(self.now)

    @rule(delta=st.integers(-5, 30))
    def reset(self, delta: int) -> None:
        offset = max(0, self.model.spso + delta)
        self.same_error(
            lambda: self.sp.reset_start_offset(offset), lambda: self.model.reset(offset)
        )

    @rule()
    def take_changes(self) -> None:
        update = self.sp.take_changes()
        if update is not None:
            data = encode_update(
                update, snapshot_epoch=0, state_epoch=0, delta_index=len(self.updates)
            )
            assert decode_update(data, where="test") == (update, 0, 0, len(self.updates))
            self.updates.append(update)
            # Applying an update twice is harmless (idempotent replay).
            assert replay(self.base, [*self.updates, update]) == replay(self.base, self.updates)
        assert self.sp.take_changes() is None
        assert replay(self.base, self.updates) == self.sp.snapshot()

    # -- invariants ----------------------------------------------------------------------------

    @invariant()
    def agrees_with_model(self) -> None:
        if not hasattr(self, "sp"):
            return
        sp, m = self.sp, self.model
        assert (sp.start_offset, sp.end_offset) == (m.spso, m.speo)
        assert sp.in_flight_count == m.speo - m.spso
        for o in range(m.spso - 2, m.speo + 2):
            assert sp.record(o) == m.view(o), o
        acquired = [r for r in m.recs.values() if r[0] is AQ]
        assert sp.acquired_count == len(acquired)
        assert sp.available_count == sum(r[0] is AV for r in m.recs.values())
        assert sp.next_lock_deadline() == min((r[3] for r in acquired), default=None)
        # Runs cover SPSO..SPEO-1 exactly and are maximal: adjacent runs differ (Acquired ones
        # may differ only by when they were acquired, which share.record.lock.max.renewal.ms
        # needs and the views don't show).
        runs = list(sp.in_flight())
        assert sp.run_count == len(runs)
        expected_first = m.spso
        for prev, run in zip([None, *runs], runs, strict=False):
            assert run.first_offset == expected_first
            expected_first = run.last_offset + 1
            if prev is not None and run.state is not AQ:
                key = (run.state, run.delivery_count, run.member_id, run.lock_deadline_ms)
                assert key != (
                    prev.state,
                    prev.delivery_count,
                    prev.member_id,
                    prev.lock_deadline_ms,
                )
        assert expected_first == m.speo

    @invariant()
    def durable_form_restores(self) -> None:
        if not hasattr(self, "sp"):
            return
        snapshot = self.sp.snapshot()
        assert snapshot == self.model.persisted()
        restored = SharePartition.restore(self.cfg, *snapshot)
        # A restore is a leader takeover: every record comes back as it was, Acquired ones
        # with their owner and lock deadline (the locks are persisted).
        assert (restored.start_offset, restored.end_offset) == (self.model.spso, self.model.speo)
        for o in range(self.model.spso, self.model.speo):
            assert restored.record(o) == self.model.view(o)
        assert restored.acquired_count == self.sp.acquired_count
        assert restored.available_count == self.sp.available_count
        assert restored.next_lock_deadline() == self.sp.next_lock_deadline()
        assert restored.snapshot() == snapshot
        # And its locks elapse when the model says: every Acquired record due by then.
        later = max(self.now, self.sp.next_lock_deadline() or self.now)
        views = [self.model.view(o) for o in range(self.model.spso, self.model.speo)]
        due = sum(1 for v in views if v.state is AQ and (v.lock_deadline_ms or 0) <= later)
        assert restored.expire_locks(later) == due


ShareMachine.TestCase.settings = settings(
    max_examples=200,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
test_share_partition_matches_model = ShareMachine.TestCase
