"""``queueflow.faust_app`` without a broker: building apps, roles, ``attach``, settings errors,
and the state path (``partition_scope``, ``ChangelogWriter``, ``LeaderStateTable``) on a real
Faust RocksDB table."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import faust
import pytest
from aiokafka import TopicPartition as KafkaTopicPartition
from structlog.testing import capture_logs

import queueflow
from queueflow import _compat, dashboard, faust_app
from queueflow.errors import ConfigurationError
from queueflow.faust_app import (
    LEADER_GROUP_DEFAULTS,
    ChangelogWriter,
    FaustRuntime,
    FaustSender,
    LeaderStateTable,
    ShareAgentService,
    ShareGroups,
    app_group_configs,
    faust_decoder,
    partition_scope,
    raw_table,
)
from queueflow.member.agent import ShareAgent
from queueflow.member.agent.outputs import Outbound
from queueflow.member.lifecycle import AgentState
from queueflow.protocol import topics
from queueflow.server.transport import monotonic_ms
from queueflow.settings import ShareGroupSettings
from queueflow.structs import ShareRecord

BROKER = "kafka://localhost:1"  # nothing listens: these tests never start an app


@pytest.fixture(autouse=True)
def loop(faust_loop: asyncio.AbstractEventLoop) -> asyncio.AbstractEventLoop:
    """Every test here gets Faust's event loop (conftest ``faust_loop``)."""
    return faust_loop


def make_app(name: str = "qf-unit", **kwargs: Any) -> queueflow.App:
    kwargs.setdefault("broker", BROKER)
    kwargs.setdefault("store", "memory://")
    return queueflow.App(name, **kwargs)


async def handler(record: ShareRecord) -> None:
    return None


# --- building apps and roles ---------------------------------------------------------------


def test_an_app_of_role_all_hosts_coordinator_leaders_and_agents() -> None:
    app = make_app()
    groups = app.share_groups
    assert (groups.role, groups.leads, groups.app_id) == ("all", True, "qf-unit")
    assert groups.coordinator is not None and not app.producer_only

    agent = app.share_agent("jobs", group="g", concurrency=2)(handler)

    assert isinstance(agent, ShareAgent) and groups.agents == [agent]
    assert agent.name == f"{handler.__module__}.{handler.__qualname__}"
    assert list(groups.leaders) == ["jobs"]
    assert groups._request_topics["jobs"].get_topic_name() == topics.request_topic(
        "qf-unit", "jobs"
    )
    services = [s for s in app._extra_services if isinstance(s, ShareAgentService)]
    assert [s.agent for s in services] == [agent]
    assert services[0].label == f"ShareAgent: {agent.name}"


def test_an_agent_stopped_before_its_service_started_is_not_started(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """A SIGTERM while the worker starts (in its first rebalance): Faust stops the agents,
    then starts the services it had not started yet; the stopped agent stays stopped (it
    used to raise IllegalTransitionError, and the worker exited 1)."""
    app = make_app()
    agent = app.share_agent("jobs", group="g")(handler)
    (service,) = [s for s in app._extra_services if isinstance(s, ShareAgentService)]
    loop.run_until_complete(agent.stop())

    loop.run_until_complete(service.on_start())

    assert agent.lifecycle.state is AgentState.STOPPED


def test_a_member_worker_is_producer_only_and_leads_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("QUEUEFLOW_ROLE", "member")
    app = make_app()
    groups = app.share_groups
    assert (groups.role, groups.leads, app.producer_only) == ("member", False, True)
    assert groups.coordinator is None and groups.endpoint is None
    app.share_agent("jobs", group="g")(handler)
    assert groups.leaders == {} and groups.lead("jobs") is None
    assert len(groups.agents) == 1


def test_a_leader_worker_leads_the_agents_topics_but_runs_no_agent() -> None:
    app = make_app(role="leader")
    app.share_agent("jobs", group="g")(handler)
    assert list(app.share_groups.leaders) == ["jobs"]
    assert not [s for s in app._extra_services if isinstance(s, ShareAgentService)]


def test_lead_hosts_a_topic_once() -> None:
    groups = make_app(role="leader").share_groups
    leader = groups.lead("jobs")
    assert leader is not None and groups.lead("jobs") is leader


def test_an_unknown_role_is_refused_naming_the_roles() -> None:
    with pytest.raises(ConfigurationError, match="all, leader, member"):
        make_app(role="boss")


def test_an_invalid_setting_is_refused() -> None:
    with pytest.raises(ConfigurationError):
        make_app(share_settings={"queueflow.no.such.setting": 1})


def test_invalid_group_configs_name_the_group() -> None:
    with pytest.raises(ConfigurationError, match="'thumbnailers'"):
        make_app(group_configs={"thumbnailers": {"share.delivery.count.limit": 10**9}})
    with pytest.raises(ConfigurationError, match="'thumbnailers'"):
        make_app(group_configs={"thumbnailers": {"share.no.such.config": 1}})


def test_app_group_configs_are_validated_per_group() -> None:
    settings = ShareGroupSettings.load()
    assert app_group_configs(None, settings) == {}
    checked = app_group_configs({"g": {"share.delivery.count.limit": 3}}, settings)
    assert checked == {"g": {"share.delivery.count.limit": "3"}}


def test_a_key_ordered_agent_makes_share_ordering_key_the_app_default_for_its_group() -> None:
    app = make_app(role="member")
    app.share_agent("jobs", group="ledger", ordering="key")(handler)
    app.share_agent("jobs", group="other")(handler)
    groups = app.share_groups.group_configs
    assert groups["ledger"] == {"share.ordering": "key"} and "other" not in groups
    with pytest.raises(ConfigurationError, match="ordering='sideways'"):
        app.share_agent("jobs", group="g", ordering="sideways")(handler)
    clash = make_app(role="member", group_configs={"x": {"share.ordering": "none"}})
    with pytest.raises(ConfigurationError, match=r"share\.ordering=.none. for it"):
        clash.share_agent("jobs", group="x", ordering="key")(handler)


def test_share_agent_options_are_checked() -> None:
    app = make_app(role="member")
    with pytest.raises(ConfigurationError):
        app.share_agent("jobs", group="g", concurrency=0)(handler)
    with pytest.raises(ConfigurationError):
        app.share_agent("jobs", group="g", batch_size=3)(handler)  # without batch=True


def test_leader_group_timeouts_default_unless_the_environment_sets_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    app = make_app()
    assert app.conf.broker_session_timeout == LEADER_GROUP_DEFAULTS["broker_session_timeout"]
    assert app.conf.broker_heartbeat_interval == LEADER_GROUP_DEFAULTS["broker_heartbeat_interval"]
    explicit = make_app("qf-unit-explicit", broker_session_timeout=30.0)
    assert explicit.conf.broker_session_timeout == 30.0
    monkeypatch.setenv("BROKER_SESSION_TIMEOUT", "45")
    from_env = make_app("qf-unit-env")
    assert from_env.conf.broker_session_timeout != LEADER_GROUP_DEFAULTS["broker_session_timeout"]


def test_the_store_defaults_to_rocksdb(tmp_path: Path) -> None:
    app = queueflow.App("qf-unit-store", broker=BROKER, datadir=tmp_path)
    assert str(app.conf.store).startswith("rocksdb:")


def test_metrics_and_dashboard_pages_are_served() -> None:
    app = make_app()
    views = app.web.views
    assert "/metrics" in views and dashboard.PAGE_PATH in views and dashboard.API_PATH in views


# --- attach ----------------------------------------------------------------------------------


def test_attach_adds_share_groups_to_a_faust_app_and_runs_them_with_it(
    loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = faust.App("qf-unit-attach", broker=BROKER, store="memory://")
    calls: list[str] = []

    async def original_first_start() -> None:
        calls.append("faust first start")

    async def original_stop() -> None:
        calls.append("faust stop")

    app.on_first_start = original_first_start  # type: ignore[method-assign]
    app.on_stop = original_stop  # type: ignore[method-assign]
    groups = queueflow.attach(app, role="member")
    assert isinstance(groups, ShareGroups) and groups.app is app and groups.role == "member"
    agent = groups.share_agent("jobs", group="g")(handler)
    assert isinstance(agent, ShareAgent)

    async def prepare() -> None:
        calls.append("prepare")

    async def stop_agents() -> None:
        calls.append("stop agents")

    async def close() -> None:
        calls.append("close")

    monkeypatch.setattr(groups, "prepare", prepare)
    monkeypatch.setattr(groups, "stop_agents", stop_agents)
    monkeypatch.setattr(groups, "close", close)
    loop.run_until_complete(app.on_first_start())
    loop.run_until_complete(app.on_stop())
    # The agents stop before Faust's own on_stop stops the consumer.
    assert calls == ["faust first start", "prepare", "stop agents", "close", "faust stop"]


def test_attach_refuses_an_unknown_role() -> None:
    with pytest.raises(ConfigurationError):
        queueflow.attach(faust.App("qf-unit-attach-bad", broker=BROKER), role="boss")


# --- decoding --------------------------------------------------------------------------------


def test_faust_decoder_decodes_typed_topics_and_leaves_raw_ones() -> None:
    app = make_app(role="member")
    assert faust_decoder(app, "jobs") is None
    assert (
        faust_decoder(app, app.topic("raw", key_serializer="raw", value_serializer="raw")) is None
    )
    decode = faust_decoder(app, app.topic("typed", value_serializer="json"))
    assert decode is not None
    record = ShareRecord("typed", 0, 5, b"k", b'{"n": 1}', [], 0, 1, b'{"n": 1}', b"k")
    decode(record)
    assert record.value == {"n": 1}


# --- the state path on a real Faust table ----------------------------------------------------


class Sent:
    def __init__(self, topic: str, key: bytes, value: bytes | None, partition: int) -> None:
        self.topic, self.key, self.value, self.partition = topic, key, value, partition
        self.future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()


class FakeProducer:
    """The Faust producer's ``send``: returns a future the test resolves (the broker's ack)."""

    def __init__(self) -> None:
        self.sent: list[Sent] = []
        self.refuse: BaseException | None = None

    async def send(
        self, topic: str, key: bytes, value: bytes | None, partition: int, *_: Any
    ) -> Any:
        if self.refuse is not None:
            raise self.refuse
        self.sent.append(Sent(topic, key, value, partition))
        return self.sent[-1].future


class Acked:
    def __init__(self, topic: str, partition: int, offset: int) -> None:
        self.topic_partition = KafkaTopicPartition(topic, partition)
        self.offset = offset


@pytest.fixture
def state(tmp_path: Path) -> tuple[faust.App, Any, FakeProducer]:
    app = faust.App("qf-unit-state", broker=BROKER, store="rocksdb://", datadir=tmp_path)
    table = raw_table(app, topics.state_table("jobs"), partitions=4)
    producer = FakeProducer()
    app.producer = producer
    return app, table, producer


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_state_writes_go_to_the_scoped_partition_and_the_changelog_in_order(
    state: tuple[faust.App, Any, FakeProducer], loop: asyncio.AbstractEventLoop
) -> None:
    app, table, producer = state

    async def scenario() -> None:
        writer = ChangelogWriter(app)
        table_of_leader = LeaderStateTable(table, writer)
        with partition_scope("qf-unit-state-fetch", 2):
            table_of_leader[b"a"] = b"1"
            table_of_leader[b"b"] = b"2"
            del table_of_leader[b"a"]
            del table_of_leader[b"never"]  # deleting a missing key is no error
            assert (table_of_leader.get(b"a"), table_of_leader.get(b"b")) == (None, b"2")
        with partition_scope("qf-unit-state-fetch", 1):
            assert table_of_leader.get(b"b") is None  # another partition's store
        await settle()
        changelog = table.changelog_topic.get_topic_name()
        assert [(s.topic, s.key, s.value, s.partition) for s in producer.sent] == [
            (changelog, b"a", b"1", 2),
            (changelog, b"b", b"2", 2),
            (changelog, b"a", None, 2),
            (changelog, b"never", None, 2),
        ]
        flushed = asyncio.ensure_future(writer.flush())
        await settle()
        assert not flushed.done()  # waits for the broker's acknowledgements
        for offset, sent in enumerate(producer.sent):
            sent.future.set_result(Acked(changelog, 2, offset))
        await asyncio.wait_for(flushed, 5)
        store = _compat.table_store(table)
        assert store.persisted_offset(KafkaTopicPartition(changelog, 2)) == 3

    loop.run_until_complete(scenario())


def test_a_changelog_ack_after_the_ownership_changed_does_not_advance_recovery(
    state: tuple[faust.App, Any, FakeProducer], loop: asyncio.AbstractEventLoop
) -> None:
    # A write held up by a network partition is acknowledged after a successor's writes, at
    # a higher offset: recording it would make this worker's next table recovery skip them.
    app, table, producer = state
    owner: list[int | None] = [2]

    async def scenario() -> None:
        writer = ChangelogWriter(app, lambda: owner[0])
        leader_table = LeaderStateTable(table, writer)
        changelog = table.changelog_topic.get_topic_name()
        store = _compat.table_store(table)
        tp = KafkaTopicPartition(changelog, 0)
        with partition_scope("qf-unit-state-fetch", 0):
            leader_table[b"S"] = b"mine"  # made at generation 2, the lease holding
            leader_table[b"D"] = b"mine too"
        await settle()
        producer.sent[0].future.set_result(Acked(changelog, 0, 5))
        await settle()
        assert store.persisted_offset(tp) == 5  # same ownership: recovery may start after it
        owner[0] = None  # the lease lapsed; the successor writes offsets 6..9 meanwhile
        with capture_logs() as logs:
            producer.sent[1].future.set_result(Acked(changelog, 0, 10))
            await asyncio.wait_for(writer.flush(), 5)  # durable all the same
        assert store.persisted_offset(tp) == 5
        assert [e["event"] for e in logs] == ["state_changelog_offset_held"]
        assert (logs[0]["written_generation"], logs[0]["acked_generation"]) == (2, None)
        owner[0] = 4  # back after a rebalance: a late ack of generation 2 is no proof either
        with partition_scope("qf-unit-state-fetch", 0):
            leader_table[b"D2"] = b"new"  # made at generation 4
        await settle()
        producer.sent[2].future.set_result(Acked(changelog, 0, 12))
        await asyncio.wait_for(writer.flush(), 5)
        assert store.persisted_offset(tp) == 12

    loop.run_until_complete(scenario())


def test_a_failed_changelog_write_fails_the_flush(
    state: tuple[faust.App, Any, FakeProducer], loop: asyncio.AbstractEventLoop
) -> None:
    app, table, producer = state

    async def scenario() -> None:
        writer = ChangelogWriter(app)
        with partition_scope("qf-unit-state-fetch", 0):
            LeaderStateTable(table, writer)[b"a"] = b"1"
        await settle()
        producer.sent[0].future.set_exception(RuntimeError("broker said no"))
        with pytest.raises(RuntimeError, match="broker said no"):
            await asyncio.wait_for(writer.flush(), 5)
        producer.refuse = OSError("producer down")
        with partition_scope("qf-unit-state-fetch", 0):
            LeaderStateTable(table, writer)[b"b"] = b"2"
        with pytest.raises(OSError, match="producer down"):
            await asyncio.wait_for(writer.flush(), 5)

    loop.run_until_complete(scenario())


def test_a_state_write_outside_a_partition_scope_is_a_bug(
    state: tuple[faust.App, Any, FakeProducer], loop: asyncio.AbstractEventLoop
) -> None:
    app, table, _ = state

    async def scenario() -> None:
        with pytest.raises(RuntimeError, match="outside a stream event"):
            LeaderStateTable(table, ChangelogWriter(app))[b"a"] = b"1"

    loop.run_until_complete(scenario())


def test_raw_tables_keep_bytes() -> None:
    app = make_app(role="member")
    table = raw_table(app, "raw-state", partitions=3)
    assert (table.key_serializer, table.value_serializer) == ("raw", "raw")
    changelog = table.changelog_topic
    assert (changelog.key_serializer, changelog.value_serializer) == ("raw", "raw")


# --- the runtime and the sender --------------------------------------------------------------


class Coordinator:
    generation = 4

    def __init__(self) -> None:
        self.beats = 0

    async def _do_heartbeat(self) -> bool:
        self.beats += 1
        return True


def test_watch_heartbeats_wraps_the_coordinator_once_and_feeds_the_lease(
    loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = make_app()
    runtime = FaustRuntime(app)
    coordinator = Coordinator()
    monkeypatch.setattr(_compat, "group_coordinator", lambda _app: coordinator)
    monkeypatch.setattr(FaustRuntime, "generation", property(lambda self: 4))
    runtime.watch_heartbeats()
    wrapped = coordinator._do_heartbeat
    runtime.watch_heartbeats()  # idempotent: not wrapped twice
    assert coordinator._do_heartbeat is wrapped
    assert runtime.lease_remaining_ms() == 0
    assert loop.run_until_complete(coordinator._do_heartbeat()) is True
    assert coordinator.beats == 1 and runtime.lease_remaining_ms() > 0


def test_the_sender_refreshes_metadata_once_for_an_unknown_partition(
    loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = make_app()
    sends: list[tuple[Any, ...]] = []
    refreshed: list[Any] = []

    class Producer:
        async def send(self, *args: Any) -> None:
            sends.append(args)
            if len(sends) == 1:
                raise AssertionError("Unrecognized partition")

    async def refresh(target: Any) -> None:
        refreshed.append(target)

    app.producer = Producer()
    monkeypatch.setattr(_compat, "refresh_producer_metadata", refresh)
    loop.run_until_complete(FaustSender(app).send("t", 3, b"v", b"k"))
    assert refreshed == [app]
    assert sends == [("t", b"k", b"v", 3, None, None)] * 2


def test_a_stalled_table_recovery_crashes_and_stops_the_worker_once(
    loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = make_app(share_settings={"queueflow.leader.recovery.stall.ms": 1000})
    groups = app.share_groups
    crashed: list[BaseException] = []
    killed: list[tuple[int, int]] = []

    async def crash(exc: BaseException) -> None:
        crashed.append(exc)

    monkeypatch.setattr(app, "crash", crash)
    monkeypatch.setattr(faust_app.os, "kill", lambda pid, sig: killed.append((pid, sig)))
    monkeypatch.setattr(_compat, "table_recovery", lambda _app: (True, 7))
    for now in (0, 500, 1000, 1500):
        loop.run_until_complete(groups._watch_recovery(now))
    assert len(crashed) == 1 and "7 changelog records left" in str(crashed[0])
    assert len(killed) == 1


def test_a_recovery_that_is_not_running_is_not_stalled(
    loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = make_app(share_settings={"queueflow.leader.recovery.stall.ms": 1000})
    monkeypatch.setattr(faust_app.os, "kill", lambda pid, sig: pytest.fail("killed"))
    for now in (0, 5_000, 10_000):
        loop.run_until_complete(app.share_groups._watch_recovery(now))


def test_share_agent_service_starts_and_stops_its_agent(loop: asyncio.AbstractEventLoop) -> None:
    calls: list[str] = []

    class Agent:
        name = "a"
        stopping = False

        async def start(self) -> None:
            calls.append("start")

        async def stop(self) -> None:
            calls.append("stop")

    service = ShareAgentService(Agent())  # type: ignore[arg-type]
    loop.run_until_complete(service.on_start())
    loop.run_until_complete(service.on_stop())
    assert calls == ["start", "stop"]


@pytest.mark.parametrize(
    ("secret", "warned"), [(None, True), ("kQ7v-2Lr9_XwN4pZtB8mYc3HsJ6dFgU1eRoV5aTi0", False)]
)
def test_unsigned_control_messages_are_warned_about_at_start_not_when_built(
    secret: str | None,
    warned: bool,
    loop: asyncio.AbstractEventLoop,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from structlog.testing import capture_logs

    settings = {"queueflow.auth.secret": secret} if secret else {}
    with capture_logs() as built:
        groups = make_app(role="member", share_settings=settings).share_groups

    async def no_broker_wait(*_: Any) -> None:
        return None

    monkeypatch.setattr(faust_app, "wait_for_broker", no_broker_wait)
    with capture_logs() as started:
        loop.run_until_complete(groups.prepare())
    assert not [e for e in built if e["event"] == "control_messages_unauthenticated"]
    unsigned = [e for e in started if e["event"] == "control_messages_unauthenticated"]
    assert bool(unsigned) is warned


def test_a_revocation_after_a_pause_longer_than_the_session_steps_down_first(
    loop: asyncio.AbstractEventLoop,
) -> None:
    # Woken from SIGSTOP, the consumer thread's revocation may reach the loop before the stall
    # guard's timer does; the worker must still say it stepped down for the stall.
    app = make_app()
    groups = app.share_groups
    app.share_agent("jobs", group="g")(handler)
    leader, coordinator = groups.leaders["jobs"], groups.coordinator
    assert coordinator is not None
    leader.assign({0}, 1)
    coordinator.assign({0}, 1)
    now = monotonic_ms(groups.server_context.clock)
    for fencing in (leader.fencing, coordinator.gate.fencing):
        fencing.alive(now - 10 * fencing.stall_limit_ms)  # last seen alive long ago
    revoked = {
        KafkaTopicPartition(topics.request_topic("qf-unit", "jobs"), 0),
        KafkaTopicPartition(topics.coordinator_topic("qf-unit"), 0),
    }
    with capture_logs() as logs:
        loop.run_until_complete(groups._on_revoked(app, revoked))
    events = [e["event"] for e in logs]
    assert "leader_stepped_down" in events and "coordinator_stepped_down" in events
    assert not leader.fencing.partitions and not coordinator.gate.fencing.partitions


def test_a_member_worker_runs_on_a_member_credential_alone_and_a_leader_worker_does_not() -> None:
    """A process running only share agents needs a member credential, not the worker secret;
    a worker hosting the coordinator or leaders with a credential alone is refused at once."""
    from queueflow.protocol.credentials import member_credential

    secret = "mW7-member-worker-secret-2Kq_Wm9Zb4Nr6Vt1Lc8Hy"
    credential = member_credential(secret, "qf-unit")
    share_settings = {"queueflow.auth.member.credential": credential}
    app = make_app(role="member", share_settings=share_settings)
    app.share_agent("jobs", group="g")(handler)
    assert app.share_groups.settings.control_auth_mode.value == "hmac"
    with pytest.raises(ConfigurationError, match=r"queueflow\.auth\.secret"):
        make_app(role="leader", share_settings=share_settings)


# --- results: sink=, dead_letter=, processing_guarantee=, FaustEncoder ------------------------


def test_share_agent_passes_sink_dead_letter_and_guarantee_and_checks_the_guarantee() -> None:
    app = make_app()
    out = app.topic("out", value_serializer="json")
    agent = app.share_agent("jobs", group="g", sink=out, dead_letter="dlq")(handler)
    assert agent.options.sink == (out,) and agent.options.dead_letter == "dlq"
    assert agent.processing_guarantee == "at_least_once"  # the app's default
    assert agent.runner.routes is not None and agent.runner.routes.sinks == (out,)
    with pytest.raises(ConfigurationError, match=r"queueflow\.processing\.guarantee=exactly_once"):
        app.share_agent("jobs", group="h", processing_guarantee="exactly_once")(handler)
    eos_app = make_app(share_settings={"queueflow.processing.guarantee": "exactly_once"})
    eos = eos_app.share_agent("jobs", group="h", processing_guarantee="exactly_once")(handler)
    assert eos.processing_guarantee == "exactly_once"
    eos_app.share_groups.agents.clear()
    with pytest.raises(ConfigurationError, match="'at_least_once', 'exactly_once'"):
        app.share_agent("jobs", group="g", processing_guarantee="exactly-once")(handler)
    app.share_groups.agents.clear()


def test_the_app_setting_sets_the_default_guarantee() -> None:
    app = make_app(share_settings={"queueflow.processing.guarantee": "exactly_once"})
    assert app.share_agent("jobs", group="g")(handler).processing_guarantee == "exactly_once"


def test_an_async_generator_handler_cant_be_a_batch_handler() -> None:
    async def generator(record: Any) -> Any:
        yield 1

    with pytest.raises(ConfigurationError, match="async generator handler can't be a batch"):
        make_app().share_agent("jobs", group="g", batch=True)(generator)


def test_faust_encoder_uses_each_destinations_serializers() -> None:
    app = make_app()
    encoder = faust_app.FaustEncoder(app)
    raw = app.topic("raw", key_type=str, value_serializer="raw")
    js = app.topic("js", value_serializer="json")

    @app.agent(js)
    async def consumer(stream: Any) -> None:
        async for _ in stream:
            pass

    assert encoder.topic_name("name") == "name"
    assert encoder.topic_name(raw) == "raw" and encoder.topic_name(consumer) == "js"
    assert encoder.encode(Outbound(raw, "k", b"v")) == (b"k", b"v")
    assert encoder.encode(Outbound(js, b"k", {"a": 1})) == (b"k", b'{"a":1}')
    assert encoder.encode(Outbound(consumer, None, [1])) == (None, b"[1]")
    assert encoder.encode(Outbound("name", b"k", {"a": 1})) == (b"k", b'{"a":1}')  # app default
    assert encoder.encode(Outbound(js, b"k", b"\xff raw", raw=True)) == (b"k", b"\xff raw")
    with pytest.raises(TypeError):
        encoder.encode(Outbound(js, b"k", object()))
    with pytest.raises(TypeError, match="a topic name, a Faust topic or a Faust agent"):
        encoder.topic_name(42)


# --- the fences task's pace --------------------------------------------------------------


def test_the_fences_task_slows_down_while_nothing_moves_and_keeps_pace_when_it_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Idle (every led partition live, no rebalance, nothing moved for FENCES_SETTLE_S) it runs
    every FENCES_IDLE_INTERVAL_S, not 10 times a second; a partition not live yet, a rebalance,
    streams not active, an assignment or a stall put it back at the stall guard's pace."""
    from types import SimpleNamespace

    from queueflow.faust_app import FENCES_IDLE_INTERVAL_S, FENCES_SETTLE_S, STALL_CHECK_INTERVAL_S
    from queueflow.testing import FakeClock

    app = make_app(role="leader")
    app.share_agent("jobs", group="g")(handler)
    groups = app.share_groups
    clock = FakeClock()
    groups.server_context.clock = clock
    runtime = SimpleNamespace(rebalancing=False, streams_active=True)
    monkeypatch.setattr(groups, "_runtime", runtime)
    leader = groups.leaders["jobs"]
    assert groups._fences_interval_s() == FENCES_IDLE_INTERVAL_S  # leads nothing yet: idle
    leader.fencing.assign({0, 1}, 1)
    assert groups._fences_interval_s() == STALL_CHECK_INTERVAL_S  # awaiting its fences
    monkeypatch.setattr(leader.fencing, "is_live", lambda p: True)
    assert groups._fences_interval_s() == FENCES_IDLE_INTERVAL_S  # every partition live
    runtime.rebalancing = True
    assert groups._fences_interval_s() == STALL_CHECK_INTERVAL_S
    runtime.rebalancing, runtime.streams_active = False, False
    assert groups._fences_interval_s() == STALL_CHECK_INTERVAL_S
    runtime.streams_active = True
    groups._fences_unsettled(int(clock.monotonic() * 1000))  # an assignment, a revocation
    assert groups._fences_wake.is_set()
    assert groups._fences_interval_s() == STALL_CHECK_INTERVAL_S
    clock.advance(int(FENCES_SETTLE_S * 1000) + 1)
    assert groups._fences_interval_s() == FENCES_IDLE_INTERVAL_S
