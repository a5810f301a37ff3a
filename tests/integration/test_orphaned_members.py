"""Members whose leave could not be delivered (the leader workers, which run the coordinator,
stopped before them) don't hold their share group non-empty for ever: once their session
lapses the group reads Empty, and the CLI names who held it and since when (docs/operations.md
"Share groups that stay non-empty")."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from queueflow import ShareConsumer
from queueflow.admin import ShareGroupAdmin, ShareGroupDescription
from queueflow.kafka.config import KafkaClientConfig
from queueflow.testing import LeaderWorker

SESSION_MS = 8000
#: How long after the leader stopped the group may take to read Empty: the session timeout
#: (counted from a stored heartbeat at most a third of a session old) plus a margin for a busy
#: machine.
EMPTY_WITHIN_S = SESSION_MS / 1000 + 12
LEADER_SETTINGS = {
    "group.share.session.timeout.ms": SESSION_MS,
    "group.share.heartbeat.interval.ms": 500,
    "queueflow.lock.check.interval.ms": 100,
}
#: Members give up on a leave (and other requests) after 2 s.
MEMBER_SETTINGS = {
    "group.share.heartbeat.interval.ms": 500,
    "group.share.session.timeout.ms": SESSION_MS,
    "queueflow.request.timeout.ms": 2000,
}


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "queueflow", "share-groups", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


async def wait_for(
    admin: ShareGroupAdmin,
    group: str,
    done: Callable[[ShareGroupDescription], bool],
    timeout_s: float,
) -> ShareGroupDescription:
    deadline = time.monotonic() + timeout_s
    while True:
        (description,) = await admin.describe_groups([group])
        if done(description) or time.monotonic() > deadline:
            return description
        await asyncio.sleep(0.5)


def test_members_of_stopped_leaders_expire_and_the_group_becomes_empty(
    kafka_bootstrap: str, topic_factory: Callable[..., str], tmp_path: Path
) -> None:
    topic = topic_factory(2)
    app_id = f"qf-orphans-{uuid.uuid4().hex[:8]}"
    group = "orphans"
    base = ["--bootstrap-server", kafka_bootstrap, "--app", app_id]
    leader = LeaderWorker(app_id, [topic], kafka_bootstrap, tmp_path / "leader", LEADER_SETTINGS)
    leader.start()

    async def scenario() -> None:
        admin = ShareGroupAdmin(app_id, KafkaClientConfig(kafka_bootstrap, "orphans-test"), 10_000)
        members = [
            ShareConsumer(
                group, app_id=app_id, bootstrap_servers=kafka_bootstrap, settings=MEMBER_SETTINGS
            )
            for _ in range(2)
        ]
        try:
            for m in members:
                await m.subscribe([topic])
            deadline = time.monotonic() + 30
            while not all(m.assignment for m in members) and time.monotonic() < deadline:
                await asyncio.gather(*(m.poll(200) for m in members))
            ids = sorted(str(m.member_id) for m in members)
            running = await wait_for(admin, group, lambda d: len(d.members) == 2, 20)
            assert [m.member_id for m in running.members] == ids
            assert all(m.last_heartbeat_ms for m in running.members)

            # While they run: --state and the reset refusal say who holds the group, and since when.
            state = await asyncio.to_thread(cli, *base, "--describe", "--group", group, "--state")
            print(f"$ queueflow share-groups --describe --state\n{state.stdout}")
            assert state.returncode == 0, state.stderr
            assert "Held non-empty by: " in state.stdout
            assert all(f"{i} (client-id " in state.stdout for i in ids)
            assert "last heartbeat " in state.stdout and " s ago)" in state.stdout
            verbose = await asyncio.to_thread(
                cli, *base, "--describe", "--group", group, "--members", "--verbose"
            )
            header, *rows = [line.split() for line in verbose.stdout.splitlines()]
            assert header[-2:] == ["LAST-HEARTBEAT", "AGO"], verbose.stdout
            assert all(row[-2].endswith("Z") and row[-1].endswith("s") for row in rows), rows
            reset = [*base, "--reset-offsets", "--group", group, "--all-topics"]
            refused = await asyncio.to_thread(cli, *reset, "--to-earliest", "--dry-run")
            print(f"$ queueflow share-groups --reset-offsets --dry-run\n{refused.stderr}")
            assert refused.returncode == 1
            # Kafka's line (no "Error:", as its tool), then the members holding the group
            assert refused.stderr.startswith(f"Share group '{group}' is not empty.\nIt has 2")
            assert all(i in refused.stderr for i in ids)

            # The leader worker stops first: the members' leaves can't be delivered.
            await asyncio.to_thread(leader.stop)
            stopped = time.monotonic()
            await asyncio.gather(*(m.close() for m in members))
            empty = await wait_for(admin, group, lambda d: d.state == "Empty", EMPTY_WITHIN_S)
            took = time.monotonic() - stopped
            assert empty.state == "Empty", (empty, took)
            assert took <= EMPTY_WITHIN_S
            assert sorted(m.member_id for m in empty.lapsed_members) == ids
            print(f"the group read Empty {took:.1f} s after the leader worker stopped")

            described = await asyncio.to_thread(
                cli, *base, "--describe", "--group", group, "--members"
            )
            said = described.stdout + described.stderr  # Kafka's line goes to stderr
            print(f"$ queueflow share-groups --describe --members\n{said}")
            assert f"Share group '{group}' has no active members." in described.stderr
            assert "Not counted: 2 member(s) whose session lapsed" in said
            listed = await asyncio.to_thread(cli, *base, "--list", "--state", "Empty")
            assert group in listed.stdout, listed.stdout + listed.stderr
            dry_run = await asyncio.to_thread(cli, *reset, "--to-earliest", "--dry-run")
            assert dry_run.returncode == 0, dry_run.stderr
            assert "NEW-OFFSET" in dry_run.stdout
        finally:
            for m in members:
                await m.close()

    try:
        asyncio.run(scenario())
    finally:
        leader.stop()
