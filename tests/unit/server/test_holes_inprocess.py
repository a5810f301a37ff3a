"""Acquisition counts records, not offsets, once the leader knows the holes of a
share-partition (docs/concepts.md "Acquisition counts records"): a member's GAP starts the
leader's hole reader, after which a ShareFetch for n records gets n records while the log has
them; a plain topic (no GAP) gets no reader."""

from __future__ import annotations

from inprocess_helpers import TOPIC, eventually, run, settings, settle
from structlog.testing import capture_logs

from queueflow.engine.group_config import ISOLATION_LEVEL
from queueflow.engine.state import RecordState
from queueflow.server.leader.holes import HoleReaders
from queueflow.structs import TopicPartition
from queueflow.testing.inprocess import InProcessCluster

TP = TopicPartition(TOPIC, 0)
N = 5


def holes_of(cluster: InProcessCluster) -> HoleReaders:
    """The hole readers of the cluster's leader of ``TOPIC``."""
    holes = cluster.leaders[TOPIC].fetcher.holes
    assert holes is not None
    return holes


def transactions(cluster: InProcessCluster, k: int, m: int) -> list[bytes]:
    """``k`` transactions of ``m`` records, each followed by a marker (an offset without a
    record); returns the values."""
    values: list[bytes] = []
    for t in range(k):
        for i in range(m):
            values.append(f"t{t}-{i}".encode())
            cluster.produce(TOPIC, values[-1])
        cluster.produce(TOPIC, None)
    return values


def test_after_a_gap_each_fetch_gets_n_records() -> None:
    async def scenario() -> None:
        cluster = InProcessCluster({TOPIC: 1}, settings=settings())
        values = transactions(cluster, 12, 4)
        async with cluster:
            consumer = cluster.consumer("g", max_poll_records=N)
            await consumer.subscribe([TOPIC])
            got: list[bytes] = []
            sizes: list[int] = []
            with capture_logs() as logs:
                while len(got) < len(values):
                    batch = await consumer.poll(timeout_ms=300)
                    got += [r.value for r in batch]
                    sizes.append(len(batch))
                    if any(e["event"] == "hole_reader_started" for e in logs):
                        engine = cluster.share_partition("g", TOPIC, 0)
                        # Wait until the reader has read the whole log: from then on holes
                        # don't use up max_records.
                        await eventually(
                            lambda e=engine: e.holes_read_to >= len(cluster.records[TP]),
                            "holes read",
                        )
                        break
                after = len(sizes)
                while len(got) < len(values):
                    batch = await consumer.poll(timeout_ms=300)
                    got += [r.value for r in batch]
                    if batch:
                        sizes.append(len(batch))
                await consumer.poll(timeout_ms=100)  # acknowledges the last batch
            await consumer.close()
            await settle(cluster)
            assert sorted(got) == sorted(values) and len(got) == len(values)
            # The first fetches counted the markers as records (4 records a fetch of 5 now and
            # then); once known, every fetch gets 5 records but the last.
            full = sizes[after:]
            assert full and all(s == N for s in full[:-1]), sizes
            assert any(s < N for s in sizes[:after]), sizes
            engine = cluster.share_partition("g", TOPIC, 0)
            assert engine.start_offset == len(cluster.records[TP])  # past the last marker
            assert next(e for e in logs if e["event"] == "hole_reader_started")["group"] == "g"

    run(scenario())


def test_a_plain_topic_gets_no_hole_reader() -> None:
    async def scenario() -> None:
        cluster = InProcessCluster({TOPIC: 1}, settings=settings())
        for i in range(30):
            cluster.produce(TOPIC, f"r{i}".encode())
        async with cluster:
            consumer = cluster.consumer("g", max_poll_records=N)
            await consumer.subscribe([TOPIC])
            got: list[bytes] = []
            with capture_logs() as logs:
                while len(got) < 30:
                    got += [r.value for r in await consumer.poll(timeout_ms=300)]
                await consumer.close()
                await settle(cluster)
            assert not [e for e in logs if e["event"].startswith("hole_reader")]
            assert not holes_of(cluster).reading("g", 0)

    run(scenario())


def test_read_committed_aborted_records_are_holes_too() -> None:
    async def scenario() -> None:
        cluster = InProcessCluster({TOPIC: 1}, settings=settings())
        values = transactions(cluster, 10, 4)
        # Every other transaction aborted: its 4 records hold no committed record.
        aborted = {o for t in range(1, 10, 2) for o in range(t * 5, t * 5 + 4)}
        cluster.aborted.update((TP, o) for o in aborted)
        committed = [v for i, v in enumerate(values) if (i // 4 * 5 + i % 4) not in aborted]
        async with cluster:
            admin = cluster.admin()
            joiner = cluster.consumer("c")  # the group exists: its configs can be set
            await joiner.subscribe([TOPIC])
            await joiner.close()
            await admin.alter_group_configs("c", {ISOLATION_LEVEL: "read_committed"})
            consumer = cluster.consumer("c", max_poll_records=N)
            await consumer.subscribe([TOPIC])
            got: list[bytes] = []
            while len(got) < len(committed):
                got += [r.value for r in await consumer.poll(timeout_ms=300)]
            await consumer.poll(timeout_ms=100)  # acknowledges the last batch
            await consumer.close()
            await settle(cluster)
            assert sorted(got) == sorted(committed)
            assert holes_of(cluster).reading("c", 0)
            # The reader archived most holes: the member acknowledged few as GAP.
            gaps = cluster.metrics.acknowledgements.labels("c", TOPIC, "gap")._value.get()
            assert 0 < gaps < len(aborted) + 10 - 5, gaps
            engine = cluster.share_partition("c", TOPIC, 0)
            assert engine.start_offset == len(cluster.records[TP])
            assert engine.record(len(cluster.records[TP]) - 1).state is RecordState.ARCHIVED

    run(scenario())


def test_a_hole_reader_stops_when_its_share_partition_moves_away() -> None:
    async def scenario() -> None:
        cluster = InProcessCluster({TOPIC: 1}, settings=settings())
        transactions(cluster, 3, 4)
        async with cluster:
            consumer = cluster.consumer("g", max_poll_records=N)
            await consumer.subscribe([TOPIC])
            with capture_logs() as logs:
                while not holes_of(cluster).reading("g", 0):  # run() bounds it
                    await consumer.poll(timeout_ms=100)
                cluster.leaders[TOPIC].revoke({0})  # the partition moves to another worker
                await eventually(lambda: not holes_of(cluster).reading("g", 0), "stopped", 10)
            stopped = [e for e in logs if e["event"] == "hole_reader_stopped"]
            assert [e["reason"] for e in stopped] == ["dropped"]
            await consumer.close(timeout_ms=100)  # its leader is gone: don't wait for it

    run(scenario())


def test_holes_found_read_committed_are_forgotten_when_the_group_reads_uncommitted() -> None:
    async def scenario() -> None:
        cluster = InProcessCluster({TOPIC: 1}, settings=settings())
        values = transactions(cluster, 10, 4)
        aborted = {o for t in range(1, 10, 2) for o in range(t * 5, t * 5 + 4)}
        cluster.aborted.update((TP, o) for o in aborted)
        value_at = {t * 5 + i: values[t * 4 + i] for t in range(10) for i in range(4)}
        async with cluster:
            admin = cluster.admin()
            await admin.alter_group_configs("c", {ISOLATION_LEVEL: "read_committed"})
            first = cluster.consumer("c", max_poll_records=N)
            await first.subscribe([TOPIC])
            while not holes_of(cluster).reading("c", 0):  # run() bounds it
                await first.poll(timeout_ms=100)
            engine = cluster.share_partition("c", TOPIC, 0)
            log_end = len(cluster.records[TP])
            await eventually(lambda: engine.holes_read_to >= log_end, "holes read")
            await first.close()
            # The aborted records ahead of the SPEO are holes the reader found read_committed;
            # for a read_uncommitted group they are records again.
            wanted = {value_at[o] for o in aborted if o >= engine.end_offset}
            assert len(wanted) >= 8, engine
            await admin.alter_group_configs("c", {ISOLATION_LEVEL: "read_uncommitted"})
            second = cluster.consumer("c", max_poll_records=100)  # its first fetch: the rest
            await second.subscribe([TOPIC])
            got: list[bytes] = []
            while not wanted <= set(got):
                got += [r.value for r in await second.poll(timeout_ms=100)]
            await second.close()

    run(scenario())
