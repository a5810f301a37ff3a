"""The same client, driven the same way, against a native share group on the Kafka 4.3.1 test
broker and against a queueflow group through the Kafka-protocol listener
(docs/kafka-listener.md "Native and queueflow, side by side"): what each scenario delivers, at
which delivery counts, what each commit answers and where the group's offsets end must match.

The client is confluent-kafka's ``ShareConsumer`` (librdkafka) in explicit acknowledgement
mode; the offsets are what Kafka's ``kafka-share-groups.sh --describe --offsets`` prints. Both
sides run at once, each on its own topic holding the same records, with the same group configs
(``share.auto.offset.reset=earliest``, ``share.delivery.count.limit`` and
``share.record.lock.duration.ms``): set with IncrementalAlterConfigs on the native group and
with queueflow's ``alter_group_configs`` on the queueflow one. The observations are written to
``listener-differential.json`` in pytest's base tmp dir and printed as the table of the docs.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pytest
from confluent_kafka import AcknowledgeType, KafkaException, Producer, ShareConsumer
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)
from test_kafka_listener import free_port, rows, tool_argv, wait_listening

from queueflow.admin import ShareGroupAdmin
from queueflow.devtools.broker import create_topic
from queueflow.kafka.config import KafkaClientConfig
from queueflow.testing import LeaderWorker

#: The smallest record lock Kafka lets a group have (``group.share.min.record.lock.duration.ms``,
#: a static broker config): the lock scenarios wait for it once.
LOCK_MS = 15_000
#: Deliveries before a record is archived (Kafka allows 2..10).
LIMIT = 3
GROUP_CONFIGS = {
    "share.auto.offset.reset": "earliest",
    "share.delivery.count.limit": str(LIMIT),
    "share.record.lock.duration.ms": str(LOCK_MS),
}
WAIT_S = 40.0
#: Records each scenario's topic starts with.
RECORDS = {
    "accept-all": 5,
    "release-reject": 6,
    "poison-at-the-limit": 3,
    "lock-expiry": 2,
    "late-acknowledgement": 2,
    "close-without-commit": 4,
}
SCENARIOS = list(RECORDS)


@dataclass
class Side:
    """One side of the comparison: where the client connects, how the group is configured,
    how a record is produced to the side's topic of a scenario."""

    name: str
    bootstrap: str
    kafka_bootstrap: str
    topics: dict[str, str]
    configure: Callable[[str], None]

    def consumer(self, group: str, scenario: str) -> Any:
        c = ShareConsumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": group,
                "share.acknowledgement.mode": "explicit",
            }
        )
        c.subscribe([self.topics[scenario]])
        return c

    def produce(self, scenario: str, value: str) -> None:
        producer = Producer({"bootstrap.servers": self.kafka_bootstrap})
        producer.produce(self.topics[scenario], value.encode(), partition=0)
        assert producer.flush(10) == 0


def take(consumer: Any, count: int, timeout_s: float = WAIT_S) -> list[Any]:
    """Poll until ``count`` records came (all of them returned: explicit mode wants each one
    acknowledged before the next poll)."""
    got: list[Any] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < count:
        assert time.monotonic() < deadline, f"{len(got)} of {count} records: {shown(got)}"
        got += [m for m in consumer.poll(0.5) if m.error() is None]
    return got


def until(consumer: Any, value: str, timeout_s: float = WAIT_S) -> list[Any]:
    """Poll until the record ``value`` came: every record polled up to it."""
    got: list[Any] = []
    deadline = time.monotonic() + timeout_s
    while not any(m.value() == value.encode() for m in got):
        assert time.monotonic() < deadline, f"no {value!r} yet: {shown(got)}"
        got += [m for m in consumer.poll(0.5) if m.error() is None]
    return got


def shown(messages: list[Any]) -> list[str]:
    """Records as ``offset@delivery count``."""
    return [f"{m.offset()}@{m.delivery_count()}" for m in messages]


def committed(result: dict[Any, Any]) -> str:
    """A ``commit_sync`` result: ``ok``, the error of each partition, or ``nothing``."""
    if not result:
        return "nothing"
    return ",".join("ok" if e is None else e.args[0].name() for e in result.values())


def acknowledge(consumer: Any, message: Any, kind: Any) -> str:
    """Acknowledge locally: ``ok``, or the error the client raised."""
    try:
        consumer.acknowledge(message, kind)
    except KafkaException as exc:
        return exc.args[0].name()
    except Exception as exc:  # confluent-kafka's IllegalStateException and the like
        return type(exc).__name__
    return "ok"


# -- the scenarios: the same steps on either side ------------------------------------------


def accept_all(side: Side, group: str, obs: dict[str, Any]) -> None:
    c = side.consumer(group, "accept-all")
    try:
        got = take(c, RECORDS["accept-all"])
        for m in got:
            c.acknowledge(m, AcknowledgeType.ACCEPT)
        obs["delivered"] = shown(got)
        obs["commits"] = [committed(c.commit_sync())]
    finally:
        c.close()


def release_reject(side: Side, group: str, obs: dict[str, Any]) -> None:
    """0 and 3 RELEASEd, 1 and 4 REJECTed, the rest ACCEPTed; what comes back is ACCEPTed;
    a last record shows nothing else comes back."""
    kinds = {0: AcknowledgeType.RELEASE, 3: AcknowledgeType.RELEASE}
    kinds |= {1: AcknowledgeType.REJECT, 4: AcknowledgeType.REJECT}
    c = side.consumer(group, "release-reject")
    try:
        first = take(c, RECORDS["release-reject"])
        for m in first:
            c.acknowledge(m, kinds.get(m.offset(), AcknowledgeType.ACCEPT))
        obs["commits"] = [committed(c.commit_sync())]
        again = take(c, 2)
        for m in again:
            c.acknowledge(m, AcknowledgeType.ACCEPT)
        obs["commits"].append(committed(c.commit_sync()))
        side.produce("release-reject", "last")
        rest = until(c, "last")
        for m in rest:
            c.acknowledge(m, AcknowledgeType.ACCEPT)
        obs["commits"].append(committed(c.commit_sync()))
        obs["delivered"] = shown(first) + shown(again) + shown(rest)
    finally:
        c.close()


def poison_at_the_limit(side: Side, group: str, obs: dict[str, Any]) -> None:
    """Offset 1 is RELEASEd each time it comes, the others ACCEPTed: it comes LIMIT times,
    then is archived (a last record shows it comes no more)."""
    c = side.consumer(group, "poison-at-the-limit")
    delivered: list[str] = []
    commits: list[str] = []
    try:
        poison = 0
        done = 0
        deadline = time.monotonic() + WAIT_S
        while poison < LIMIT or done < RECORDS["poison-at-the-limit"] - 1:
            assert time.monotonic() < deadline, delivered
            got = [m for m in c.poll(0.5) if m.error() is None]
            for m in got:
                if m.offset() == 1:
                    poison += 1
                    c.acknowledge(m, AcknowledgeType.RELEASE)
                else:
                    done += 1
                    c.acknowledge(m, AcknowledgeType.ACCEPT)
            if got:
                delivered += shown(got)
                commits.append(committed(c.commit_sync()))
        side.produce("poison-at-the-limit", "last")
        rest = until(c, "last")
        for m in rest:
            c.acknowledge(m, AcknowledgeType.ACCEPT)
        commits.append(committed(c.commit_sync()))
        obs["delivered"] = delivered + shown(rest)
        obs["commits"] = commits
    finally:
        c.close()


def lock_expiry(side: Side, group: str, obs: dict[str, Any]) -> None:
    """A holds the records and never acknowledges them; B gets them once A's locks elapsed."""
    a = side.consumer(group, "lock-expiry")
    b = None
    try:
        held = take(a, RECORDS["lock-expiry"])
        since = time.monotonic()
        b = side.consumer(group, "lock-expiry")
        got = take(b, len(held))
        elapsed = time.monotonic() - since
        for m in got:
            b.acknowledge(m, AcknowledgeType.ACCEPT)
        obs["delivered"] = [f"A {x}" for x in shown(held)] + [f"B {x}" for x in shown(got)]
        obs["commits"] = [f"B {committed(b.commit_sync())}"]
        obs["B after the lock"] = elapsed >= LOCK_MS / 1000 * 0.9
    finally:
        if b is not None:
            b.close()
        a.close()


def late_acknowledgement(side: Side, group: str, obs: dict[str, Any]) -> None:
    """A's locks elapse and B gets the records; A acknowledges one while B holds it, then,
    once B ACCEPTed both, the other (below the SPSO now)."""
    a = side.consumer(group, "late-acknowledgement")
    b = None
    try:
        held = take(a, RECORDS["late-acknowledgement"])
        b = side.consumer(group, "late-acknowledgement")
        got = take(b, len(held))
        steps = [f"A ack 0 {acknowledge(a, held[0], AcknowledgeType.ACCEPT)}"]
        steps.append(f"A commit {committed(a.commit_sync())}")
        for m in got:
            b.acknowledge(m, AcknowledgeType.ACCEPT)
        steps.append(f"B commit {committed(b.commit_sync())}")
        steps.append(f"A ack 1 {acknowledge(a, held[1], AcknowledgeType.REJECT)}")
        steps.append(f"A commit {committed(a.commit_sync())}")
        obs["delivered"] = [f"A {x}" for x in shown(held)] + [f"B {x}" for x in shown(got)]
        obs["commits"] = steps
    finally:
        if b is not None:
            b.close()
        a.close()


def close_without_commit(side: Side, group: str, obs: dict[str, Any]) -> None:
    """A ACCEPTs every record and closes without commit_sync (close() sends the
    acknowledgements and leaves); B then reads up to a last record: anything else it gets was
    delivered again."""
    a = side.consumer(group, "close-without-commit")
    try:
        held = take(a, RECORDS["close-without-commit"])
        for m in held:
            a.acknowledge(m, AcknowledgeType.ACCEPT)
    finally:
        a.close()
    side.produce("close-without-commit", "last")
    b = side.consumer(group, "close-without-commit")
    try:
        rest = until(b, "last")
        for m in rest:
            b.acknowledge(m, AcknowledgeType.ACCEPT)
        obs["commits"] = [f"B {committed(b.commit_sync())}"]
        obs["delivered"] = [f"A {x}" for x in shown(held)] + [f"B {x}" for x in shown(rest)]
    finally:
        b.close()


STEPS: dict[str, Callable[[Side, str, dict[str, Any]], None]] = {
    "accept-all": accept_all,
    "release-reject": release_reject,
    "poison-at-the-limit": poison_at_the_limit,
    "lock-expiry": lock_expiry,
    "late-acknowledgement": late_acknowledgement,
    "close-without-commit": close_without_commit,
}


# -- the offsets, as Kafka's tool prints them ------------------------------------------------


SETTLE_S = 12.0


def describe_offsets(bootstrap: str, group: str) -> list[str]:
    """``kafka-share-groups.sh --describe --offsets``: ``partition start-offset lag`` rows."""
    proc = subprocess.run(
        tool_argv(
            "share-groups",
            ["--bootstrap-server", bootstrap, "--describe", "--offsets", "--group", group],
        ),
        capture_output=True,
        stdin=subprocess.DEVNULL,
        text=True,
        timeout=WAIT_S,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return [" ".join(r[2:]) for r in rows(proc.stdout)]


def settled_offsets(bootstrap: str, group: str) -> list[str]:
    """The offsets once they stop moving: a broker persists a share-partition's start offset
    after the acknowledgement that moves it, so a describe at once can still show the old one.
    Read until three reads 1 s apart agree (at most ``SETTLE_S``)."""
    seen = [describe_offsets(bootstrap, group)]
    deadline = time.monotonic() + SETTLE_S
    while len(seen) < 3 or seen[-1] != seen[-2] or seen[-2] != seen[-3]:
        if time.monotonic() > deadline:
            break
        time.sleep(1.0)
        seen.append(describe_offsets(bootstrap, group))
    print(group, "offsets read:", seen)
    return seen[-1]


def observe(side: Side, scenario: str) -> dict[str, Any]:
    group = f"{scenario}-{uuid.uuid4().hex[:6]}"
    side.configure(group)
    obs: dict[str, Any] = {}
    started = time.monotonic()
    STEPS[scenario](side, group, obs)
    obs["offsets"] = settled_offsets(side.bootstrap, group)
    obs["seconds"] = round(time.monotonic() - started, 1)
    return obs


# -- the two sides ---------------------------------------------------------------------------


def configure_native(bootstrap: str) -> Callable[[str], None]:
    admin = AdminClient({"bootstrap.servers": bootstrap})

    def configure(group: str) -> None:
        resource = ConfigResource(
            ResourceType.GROUP,
            group,
            incremental_configs=[
                ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET)
                for k, v in GROUP_CONFIGS.items()
            ],
        )
        for future in admin.incremental_alter_configs([resource]).values():
            future.result(timeout=WAIT_S)

    return configure


def configure_queueflow(app_id: str, bootstrap: str) -> Callable[[str], None]:
    def configure(group: str) -> None:
        admin = ShareGroupAdmin(app_id, KafkaClientConfig(bootstrap))
        asyncio.run(admin.alter_group_configs(group, GROUP_CONFIGS))

    return configure


def scenario_topics(bootstrap: str, prefix: str) -> dict[str, str]:
    """A 1-partition topic per scenario holding its records (``<scenario>-<i>``)."""
    producer = Producer({"bootstrap.servers": bootstrap})
    names = {}
    for scenario, count in RECORDS.items():
        names[scenario] = f"{prefix}-{scenario}-{uuid.uuid4().hex[:6]}"
        create_topic(bootstrap, names[scenario], 1)
        for i in range(count):
            producer.produce(names[scenario], f"{scenario}-{i}".encode(), partition=0)
    assert producer.flush(10) == 0
    return names


@pytest.fixture(scope="module")
def sides(
    kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Side, Side]]:
    native_topics = scenario_topics(kafka_bootstrap, "qf-diff-native")
    qf_topics = scenario_topics(kafka_bootstrap, "qf-diff-qf")
    app_id, port = f"qf-diff-{uuid.uuid4().hex[:8]}", free_port()
    worker = LeaderWorker(
        app_id,
        sorted(qf_topics.values()),
        kafka_bootstrap,
        tmp_path_factory.mktemp("differential") / "data",
        {
            "group.share.heartbeat.interval.ms": 500,
            "group.share.session.timeout.ms": 6000,
            "queueflow.kafka.listener": f"PLAINTEXT://127.0.0.1:{port}",
        },
    )
    with worker.start():
        wait_listening(port, WAIT_S)
        yield (
            Side(
                "native",
                kafka_bootstrap,
                kafka_bootstrap,
                native_topics,
                configure_native(kafka_bootstrap),
            ),
            Side(
                "queueflow",
                f"127.0.0.1:{port}",
                kafka_bootstrap,
                qf_topics,
                configure_queueflow(app_id, kafka_bootstrap),
            ),
        )
        log = worker.log_path.read_text()
        assert "kafka_frame_rejected" not in log, log[-3000:]


OBSERVED: dict[str, dict[str, Any]] = {}


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, dict[str, Any]]]:
    """The observations of every scenario; written as JSON and printed as a table at the end."""
    yield OBSERVED
    out = tmp_path_factory.getbasetemp() / "listener-differential.json"
    out.write_text(json.dumps(OBSERVED, indent=2))
    print(f"\n{render(OBSERVED)}\n(written to {out})")


def render(observed: dict[str, dict[str, Any]]) -> str:
    """The docs' table: scenario | native | queueflow | match."""
    lines = ["| scenario | native | queueflow | match |", "|---|---|---|---|"]
    for scenario, sides_ in observed.items():
        cells = []
        for name in ("native", "queueflow"):
            o = dict(sides_[name])
            o.pop("seconds", None)
            cells.append("; ".join(f"{k}: {format_value(v)}" for k, v in o.items()))
        same = "yes" if cells[0] == cells[1] else "**no**"
        if same != "yes" and without_start(sides_["native"]) == without_start(sides_["queueflow"]):
            same = "yes, but the start offset (see below)"
        lines.append(f"| {scenario} | {cells[0]} | {cells[1]} | {same} |")
    return "\n".join(lines)


def without_start(observed: dict[str, Any]) -> dict[str, Any]:
    """``observed`` without ``seconds`` and with each offsets row as ``partition lag``."""
    rows_ = [" ".join(r.split()[::2]) for r in observed["offsets"]]
    return {**{k: v for k, v in observed.items() if k != "seconds"}, "offsets": rows_}


def format_value(value: Any) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(str(v) for v in value) + "]"
    return str(value)


@pytest.mark.native_share_groups
@pytest.mark.timeout(120)
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_the_same_client_sees_the_same_on_native_and_queueflow(
    scenario: str, sides: tuple[Side, Side], table: dict[str, dict[str, Any]]
) -> None:
    with ThreadPoolExecutor(2) as pool:
        native, queueflow = pool.map(lambda side: observe(side, scenario), sides)
    table[scenario] = {"native": native, "queueflow": queueflow}
    print(scenario, json.dumps(table[scenario]))
    native, queueflow = dict(native), dict(queueflow)
    native.pop("seconds"), queueflow.pop("seconds")
    native_offsets, queueflow_offsets = native.pop("offsets"), queueflow.pop("offsets")
    assert queueflow == native
    # Every record is terminal at the end of each scenario: KIP-932's start offset is past the
    # last one, as queueflow shows. Native's describe shows the start offset as of before the
    # group's last acknowledgement (it moves with the next state write), so it may be lower;
    # the partitions and the lag must match.
    last = max(int(d.split()[-1].split("@")[0]) for d in queueflow["delivered"])
    assert [row.split()[1] for row in queueflow_offsets] == [str(last + 1)]
    assert len(native_offsets) == len(queueflow_offsets)
    for n_row, q_row in zip(native_offsets, queueflow_offsets, strict=True):
        (n_part, n_start, n_lag), (q_part, q_start, q_lag) = n_row.split(), q_row.split()
        assert (n_part, n_lag) == (q_part, q_lag)
        assert int(n_start) <= int(q_start)
