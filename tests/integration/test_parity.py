"""Kafka's answers where queueflow differed, on the real broker, each checked against Kafka
4.3's native share groups where the test fixtures allow (Kafka's own client and tools in their
own JVM): a late acknowledgement of records below the SPSO, group configs set before a group's
first join, ``kafka-share-groups.sh``'s words for a group with members, without members and
without offsets; and ``ShareConsumer``'s ``KafkaShareConsumer`` parity (unsubscribe,
subscription, acknowledge by coordinates, metrics, close with a timeout, KIP-1206
``share.acquire.mode=record_limit``)."""

from __future__ import annotations

import asyncio
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from admin_env import MEMBER_SETTINGS, WAIT_S
from click.testing import CliRunner, Result

from queueflow import ACCEPT, REJECT, ShareConsumer, ShareRecord
from queueflow.devtools.broker import create_topic, kafka_tool_argv, run_kafka_tool
from queueflow.devtools.cli import cli
from queueflow.testing import LeaderWorker
from queueflow.testing import produce as produce_records

#: The broker-level start is Kafka's default (latest): groups that need the records produced
#: before their first join get ``share.auto.offset.reset=earliest`` set before it, as with
#: ``kafka-configs.sh`` on a native group.
LEADER_SETTINGS: dict[str, int | str] = {
    "share.auto.offset.reset": "latest",
    "group.share.session.timeout.ms": 6000,
    "group.share.heartbeat.interval.ms": 500,
}
NATIVE_PROGRAM = Path(__file__).resolve().parent / "native" / "LateAcknowledgement.java"
TOOL_TIMEOUT_S = 90


def lines(text: str) -> list[str]:
    """Non-blank lines with their runs of spaces made one (tables compare by content)."""
    return [" ".join(line.split()) for line in text.splitlines() if line.strip()]


#: What kafka-share-groups.sh (Kafka 4.3.1) prints, by case: (stdout lines, stderr lines),
#: with {g} the group and {t} the topic. Checked against the tool itself below.
KAFKA_WORDS = {
    "delete, members": (
        [
            "Error: Deletion of some share groups failed:",
            "* Group '{g}' could not be deleted due to: "
            "org.apache.kafka.common.errors.GroupNotEmptyException: Share group '{g}' is not "
            "EMPTY.",
        ],
        [],
    ),
    "reset, members": ([], ["Share group '{g}' is not empty."]),
    "delete offsets, members": (
        ["Error: The group is not empty.", "TOPIC STATUS", "{t} Error: The group is not empty."],
        [],
    ),
    "state, empty": (
        ["GROUP COORDINATOR (ID) STATE #MEMBERS"],
        ["Share group '{g}' has no active members."],
    ),
    "delete offsets, empty": (["TOPIC STATUS", "{t} Successful"], []),
    "describe, no offsets": (["Share group '{g}' has no offset information."], []),
}


def expected(case: str, group: str, topic: str) -> tuple[list[str], list[str]]:
    out, err = KAFKA_WORDS[case]
    return (
        [line.format(g=group, t=topic) for line in out],
        [line.format(g=group, t=topic) for line in err],
    )


def kafka_tool(bootstrap: str, *args: str) -> subprocess.CompletedProcess[str]:
    proc = run_kafka_tool("share-groups", ["--bootstrap-server", bootstrap, *args], TOOL_TIMEOUT_S)
    print(f"$ kafka-share-groups.sh {' '.join(args)}\n{proc.stdout}{proc.stderr}")
    return proc


def set_group_config(bootstrap: str, group: str, *configs: str) -> None:
    """``kafka-configs.sh --entity-type groups --alter`` on a native group."""
    run_kafka_tool(
        "configs",
        [
            *("--bootstrap-server", bootstrap, "--entity-type", "groups"),
            *("--entity-name", group, "--alter", "--add-config", ",".join(configs)),
        ],
        TOOL_TIMEOUT_S,
        check=True,
    )


def run_cli(*args: str) -> Result:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    print(f"$ queueflow {' '.join(args)}\n{result.output}")
    return result


@pytest.fixture(scope="module")
def app(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A leader worker leading a 1-partition topic and a 3-partition one."""
    one, three = (f"qf-parity-{n}-{uuid.uuid4().hex[:8]}" for n in ("one", "three"))
    create_topic(kafka_bootstrap, one, 1)
    create_topic(kafka_bootstrap, three, 3)
    app_id = f"qf-parity-{uuid.uuid4().hex[:8]}"
    worker = LeaderWorker(
        app_id,
        [one, three],
        kafka_bootstrap,
        tmp_path_factory.mktemp("parity") / "data",
        LEADER_SETTINGS,
    )
    with worker.start():
        yield {"one": one, "three": three, "app_id": app_id, "worker": worker}


def member(bootstrap: str, app_id: str, group: str, **kwargs: Any) -> ShareConsumer:
    return ShareConsumer(
        group,
        app_id=app_id,
        bootstrap_servers=bootstrap,
        acknowledgement_mode="explicit",
        settings=MEMBER_SETTINGS,
        **kwargs,
    )


def configure_before_joining(bootstrap: str, app_id: str, group: str) -> None:
    """``share.auto.offset.reset=earliest`` for a group no member has joined yet."""
    done = run_cli(
        "configs",
        "--bootstrap-server",
        bootstrap,
        "--app",
        app_id,
        "--group",
        group,
        "--alter",
        "--add-config",
        "share.auto.offset.reset=earliest",
    )
    assert done.exit_code == 0, done.output
    assert done.output.strip() == f"Completed updating config for group {group}."


async def poll_until(consumer: ShareConsumer, count: int) -> list[ShareRecord]:
    got: list[ShareRecord] = []
    deadline = time.monotonic() + WAIT_S
    while len(got) < count:
        assert time.monotonic() < deadline, f"{len(got)} of {count} records"
        got += await consumer.poll(timeout_ms=500)
    return got


# -- a late acknowledgement -----------------------------------------------------------------


def late_acknowledgement_steps(stdout: str) -> list[str]:
    return [
        line
        for line in lines(stdout)
        if line.split()[0] in ("finished", "late-commit", "callback", "closed")
    ]


@pytest.mark.native_share_groups
@pytest.mark.timeout(120)
def test_kafka_skips_a_late_acknowledgement_below_the_spso(kafka_bootstrap: str) -> None:
    """Kafka's client on a native share group: a member whose lock elapsed (15 s, the
    smallest group lock Kafka allows) acknowledges records another member finished; its
    commitSync reports no error and its close() callback gets none."""
    topic, group = f"qf-late-native-{uuid.uuid4().hex[:8]}", f"late-{uuid.uuid4().hex[:6]}"
    create_topic(kafka_bootstrap, topic, 1)
    asyncio.run(produce_records(kafka_bootstrap, topic, ["a", "b"]))
    set_group_config(
        kafka_bootstrap,
        group,
        "share.auto.offset.reset=earliest",
        "share.record.lock.duration.ms=15000",
    )
    proc = run_kafka_tool(str(NATIVE_PROGRAM), [kafka_bootstrap, topic, group], 100)
    print(proc.stdout, proc.stderr[-2000:])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "held [0, 1]" in proc.stdout
    assert late_acknowledgement_steps(proc.stdout) == [
        "finished 2 [Optional.empty]",
        "callback [[0]] null",
        "late-commit [Optional.empty]",
        "callback [[1]] null",
        "closed",
    ]


@pytest.mark.timeout(120)
def test_a_late_acknowledgement_below_the_spso_is_skipped_as_kafka_skips_it(
    kafka_bootstrap: str, app: dict[str, Any]
) -> None:
    """The same steps as Kafka's client above, with queueflow: no INVALID_REQUEST for the
    late member's commit_sync, no error for its close() callback."""
    topic, app_id = app["one"], app["app_id"]
    configure_before_joining(kafka_bootstrap, app_id, "late")

    async def scenario() -> list[str]:
        await produce_records(kafka_bootstrap, topic, ["a", "b"])
        steps: list[str] = []
        late = member(kafka_bootstrap, app_id, "late", lock_duration_ms=1000)
        late.set_acknowledgement_commit_callback(
            lambda offsets, exc: steps.append(f"callback {sorted(offsets.values())} {exc}")
        )
        await late.subscribe([topic])
        held = await poll_until(late, 2)
        assert [r.offset for r in held] == [0, 1]
        other = member(kafka_bootstrap, app_id, "late")
        await other.subscribe([topic])
        finished = await poll_until(other, 2)  # once the late member's locks elapsed
        for r in finished:
            other.acknowledge(r, ACCEPT)
        steps.append(f"finished {len(finished)} {list((await other.commit_sync()).values())}")
        await other.close()
        late.acknowledge(held[0], ACCEPT)
        steps.append(f"late-commit {list((await late.commit_sync()).values())}")
        late.acknowledge(held[1], REJECT)
        await late.close()
        steps.append("closed")
        return steps

    assert asyncio.run(scenario()) == [
        "finished 2 [None]",
        "callback [{0}] None",
        "late-commit [None]",
        "callback [{1}] None",
        "closed",
    ]


# -- group configs before the first join ----------------------------------------------------


@pytest.mark.timeout(120)
def test_configs_set_before_the_first_join_apply_when_the_group_starts(
    kafka_bootstrap: str, app: dict[str, Any]
) -> None:
    """As ``kafka-configs.sh`` on a native group (tests/integration/test_broker.py sets
    ``share.auto.offset.reset=earliest`` before its console share consumer joins): the group
    is not listed before its first join, and its first member gets the records produced before
    (the broker-level start is latest)."""
    topic, app_id = app["one"], app["app_id"]
    base = ["--bootstrap-server", kafka_bootstrap, "--app", app_id]
    asyncio.run(produce_records(kafka_bootstrap, topic, [f"early{i}" for i in range(3)]))
    configure_before_joining(kafka_bootstrap, app_id, "early")
    described = run_cli("configs", *base, "--group", "early", "--describe")
    assert lines(described.output) == [
        "Dynamic configs for group early are:",
        "share.auto.offset.reset=earliest sensitive=false "
        "synonyms={DYNAMIC_GROUP_CONFIG:share.auto.offset.reset=earliest}",
    ]
    assert "early" not in run_cli("share-groups", *base, "--list").output.split()
    nothing = run_cli("configs", *base, "--group", "never", "--describe")
    assert (
        nothing.output.strip() == "The group 'never' doesn't exist and doesn't have dynamic config."
    )

    async def first_member() -> list[bytes]:
        c = member(kafka_bootstrap, app_id, "early")
        await c.subscribe([topic])
        got = [r for r in await poll_until(c, 1)]
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:  # anything else there is comes now
            for r in got:
                c.acknowledge(r, ACCEPT)
            more = await c.poll(timeout_ms=500)
            got += more
            if not more:
                break
        await c.close()
        return [r.value for r in got]

    values = asyncio.run(first_member())
    assert [v for v in values if v.startswith(b"early")] == [b"early0", b"early1", b"early2"]
    assert "early" in run_cli("share-groups", *base, "--list").output.split()


# -- kafka-share-groups.sh's words ------------------------------------------------------------


@pytest.mark.native_share_groups
@pytest.mark.timeout(150)
def test_kafka_share_groups_words_for_a_group_with_and_without_members(
    kafka_bootstrap: str,
) -> None:
    """:data:`KAFKA_WORDS` are what Kafka's tool prints on a native group: with a console share
    consumer in it (it waits for a 5th record), then once it left (the 5th record came)."""
    topic, group = f"qf-words-{uuid.uuid4().hex[:8]}", f"native-{uuid.uuid4().hex[:6]}"
    create_topic(kafka_bootstrap, topic, 1)
    asyncio.run(produce_records(kafka_bootstrap, topic, [f"w{i}" for i in range(4)]))
    set_group_config(kafka_bootstrap, group, "share.auto.offset.reset=earliest")
    consumer = subprocess.Popen(
        kafka_tool_argv(
            "console-share-consumer",
            [
                *("--bootstrap-server", kafka_bootstrap, "--topic", topic, "--group", group),
                *("--max-messages", "5", "--timeout-ms", "100000"),
            ],
        ),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + WAIT_S
        while (
            len(
                lines(
                    kafka_tool(kafka_bootstrap, "--describe", "--group", group, "--members").stdout
                )
            )
            < 2
        ):
            assert time.monotonic() < deadline, "the console share consumer never joined"
        deleted = kafka_tool(kafka_bootstrap, "--delete", "--group", group)
        assert (lines(deleted.stdout), []) == expected("delete, members", group, topic)
        reset = kafka_tool(
            kafka_bootstrap,
            "--reset-offsets",
            "--group",
            group,
            "--topic",
            topic,
            "--to-earliest",
            "--execute",
        )
        assert reset.returncode == 1
        assert expected("reset, members", group, topic)[1][0] in lines(reset.stderr)
        kept = kafka_tool(kafka_bootstrap, "--delete-offsets", "--group", group, "--topic", topic)
        assert lines(kept.stdout) == expected("delete offsets, members", group, topic)[0]
        asyncio.run(produce_records(kafka_bootstrap, topic, ["w4"]))  # its 5th: it leaves
        assert consumer.wait(timeout=WAIT_S) == 0
    finally:
        consumer.kill()
        consumer.wait(timeout=30)
    deadline = time.monotonic() + WAIT_S
    while True:
        state = kafka_tool(kafka_bootstrap, "--describe", "--group", group, "--state")
        if "Empty" in state.stdout:
            break
        assert time.monotonic() < deadline, "the native group never became Empty"
    out, err = expected("state, empty", group, topic)
    assert lines(state.stdout)[0] == out[0] and err[0] in lines(state.stderr)
    done = kafka_tool(kafka_bootstrap, "--delete-offsets", "--group", group, "--topic", topic)
    assert lines(done.stdout) == expected("delete offsets, empty", group, topic)[0]
    described = kafka_tool(kafka_bootstrap, "--describe", "--group", group)
    assert lines(described.stdout) == expected("describe, no offsets", group, topic)[0]


@pytest.mark.timeout(120)
def test_queueflow_share_groups_prints_kafka_s_words(
    kafka_bootstrap: str, app: dict[str, Any]
) -> None:
    """:data:`KAFKA_WORDS` from ``queueflow share-groups`` on a queueflow group: with a member
    holding records, then once it left (queueflow exits 1 whenever something was refused)."""
    topic, app_id = app["one"], app["app_id"]
    base = ["share-groups", "--bootstrap-server", kafka_bootstrap, "--app", app_id]
    configure_before_joining(kafka_bootstrap, app_id, "words")

    async def with_a_member() -> None:
        await produce_records(kafka_bootstrap, topic, ["x"])
        c = member(kafka_bootstrap, app_id, "words")
        await c.subscribe([topic])
        held = await poll_until(c, 1)
        deleted = await asyncio.to_thread(run_cli, *base, "--delete", "--group", "words")
        assert deleted.exit_code == 1
        assert (lines(deleted.stdout), []) == expected("delete, members", "words", topic)
        reset = await asyncio.to_thread(
            run_cli,
            *base,
            "--reset-offsets",
            "--group",
            "words",
            "--topic",
            topic,
            "--to-earliest",
            "--execute",
        )
        assert reset.exit_code == 1
        want_out, want_err = expected("reset, members", "words", topic)
        # Kafka's line, then who holds the group (queueflow's addition, on a line of its own)
        assert lines(reset.stdout) == want_out
        assert lines(reset.stderr)[: len(want_err)] == want_err
        assert lines(reset.stderr)[len(want_err)].startswith("It has 1 member(s): ")
        kept = await asyncio.to_thread(
            run_cli, *base, "--delete-offsets", "--group", "words", "--topic", topic
        )
        assert kept.exit_code == 1
        assert lines(kept.stdout) == expected("delete offsets, members", "words", topic)[0]
        for r in held:
            c.acknowledge(r, ACCEPT)
        await c.close()

    asyncio.run(with_a_member())
    state = run_cli(*base, "--describe", "--group", "words", "--state")
    out, err = expected("state, empty", "words", topic)
    assert state.exit_code == 0
    assert lines(state.stdout)[0] == out[0] and lines(state.stderr) == err
    done = run_cli(*base, "--delete-offsets", "--group", "words", "--topic", topic)
    assert (done.exit_code, lines(done.stdout)) == (
        0,
        expected("delete offsets, empty", "words", topic)[0],
    )
    described = run_cli(*base, "--describe", "--group", "words")
    assert lines(described.stdout) == expected("describe, no offsets", "words", topic)[0]


# -- ShareConsumer parity -------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_share_consumer_unsubscribe_subscription_coordinates_and_metrics(
    kafka_bootstrap: str, app: dict[str, Any]
) -> None:
    topic, app_id = app["one"], app["app_id"]
    configure_before_joining(kafka_bootstrap, app_id, "api")

    async def scenario() -> None:
        await produce_records(kafka_bootstrap, topic, ["p0", "p1"])
        c = member(kafka_bootstrap, app_id, "api")
        assert c.subscription() == set()
        await c.subscribe([topic])
        assert c.subscription() == {topic}
        first = await poll_until(c, 1)
        mine = {r.offset for r in first}
        # acknowledge by (topic, partition, offset), as KafkaShareConsumer
        c.acknowledge(topic, 0, first[0].offset, ACCEPT)
        assert all(e is None for e in (await c.commit_sync()).values())
        metrics = c.metrics()
        fetch = metrics["consumer-share-fetch-manager-metrics"]
        assert fetch["records-consumed-total"] == len(first) and fetch["fetch-total"] >= 1
        assert fetch["acknowledgements-send-total"] == 1 and fetch["assigned-partitions"] == 1
        assert metrics["consumer-share-metrics"]["last-poll-seconds-ago"] >= 0
        await c.unsubscribe()  # the rest of the poll is released
        assert c.subscription() == set() and c.assignment() == set()
        await c.subscribe([topic])
        again = await poll_until(c, len(first) - 1)
        back = {r.offset: r.delivery_count for r in again}
        assert {o for o in mine if o != first[0].offset} <= set(back)
        assert all(back[o] == 2 for o in mine if o in back)
        for r in again:
            c.acknowledge(r, ACCEPT)
        await c.close()

    asyncio.run(scenario())


@pytest.mark.timeout(120)
def test_record_limit_keeps_every_poll_within_max_poll_records(
    kafka_bootstrap: str, app: dict[str, Any]
) -> None:
    """KIP-1206 ``share.acquire.mode=record_limit``: 3 share-partitions of 10 records and
    ``max_poll_records=4``: no poll returns more than 4, every record once."""
    topic, app_id = app["three"], app["app_id"]
    configure_before_joining(kafka_bootstrap, app_id, "strict")

    async def scenario() -> list[int]:
        await produce_records(kafka_bootstrap, topic, [f"s{i}" for i in range(30)], partitions=3)
        c = member(
            kafka_bootstrap, app_id, "strict", max_poll_records=4, acquire_mode="record_limit"
        )
        await c.subscribe([topic])
        sizes: list[int] = []
        seen: Counter[tuple[int, int]] = Counter()
        deadline = time.monotonic() + WAIT_S
        while sum(seen.values()) < 30:
            assert time.monotonic() < deadline, f"{sum(seen.values())} of 30"
            got = await c.poll(timeout_ms=500)
            sizes += [len(got)] if got else []
            seen.update((r.partition, r.offset) for r in got)
            for r in got:
                c.acknowledge(r, ACCEPT)
        assert set(seen.values()) == {1} and len(seen) == 30
        await c.close()
        return sizes

    sizes = asyncio.run(scenario())
    print(f"poll sizes: {sizes}")
    assert max(sizes) <= 4, sizes


@pytest.mark.timeout(120)
def test_close_with_a_timeout_returns_in_time_when_the_leader_does_not_answer(
    kafka_bootstrap: str, app: dict[str, Any]
) -> None:
    """``close(timeout_ms=2000)`` with the leader worker frozen (SIGSTOP): it returns within
    the bound instead of waiting for the leader, and logs it."""
    topic, app_id = app["one"], app["app_id"]
    configure_before_joining(kafka_bootstrap, app_id, "bounded")
    worker: LeaderWorker = app["worker"]

    async def scenario() -> float:
        await produce_records(kafka_bootstrap, topic, ["c0"])
        c = member(kafka_bootstrap, app_id, "bounded")
        await c.subscribe([topic])
        held = await poll_until(c, 1)
        for r in held:
            c.acknowledge(r, ACCEPT)
        worker.pause()
        try:
            started = time.monotonic()
            await c.close(timeout_ms=2000)
            return time.monotonic() - started
        finally:
            worker.resume()

    took = asyncio.run(scenario())
    assert 1.5 <= took < 4.0, took
