"""Shared pytest fixtures: one Kafka broker per test session.

* ``kafka_bootstrap`` (session): bootstrap ``host:port`` of the broker under test. With
  ``QUEUEFLOW_BROKER=host:port`` set, that existing cluster is used; otherwise ONE
  ``LocalBroker`` is started on free ports with its data under pytest's
  tmp dir, and stopped when the session ends. It is only started if a test asks for it.
* ``local_broker`` (session): that LocalBroker, or None when the cluster is external; for tests
  that stop, restart or kill the broker (skip them when it is None). A test that stops or kills
  it must start it again before returning (same ports, data kept).
* ``topic_factory`` (function): ``topic_factory(partitions=1, *, prefix=None, config=None)``
  creates a uniquely named topic and returns its name once every partition has a leader.

Tests under ``tests/integration/`` are marked ``integration`` automatically
(``pytest -m "not integration"`` runs only the fast ones).

A SIGTERM of the session unwinds like Ctrl-C (pytest tears the fixtures down: the brokers and
workers it started are stopped); the brokers and workers also get SIGTERM from the kernel if
the session dies without that (``die_with_parent``, see :mod:`queueflow.devtools.children`).
"""

from __future__ import annotations

import os
import re
import signal
import sys
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest
import stamina
from integration.security_env import secured_broker  # noqa: F401 (a fixture)

from queueflow.devtools.broker import (
    LocalBroker,
    bootstrap_from_env,
    create_topic,
    find_free_ports,
)
from queueflow.devtools.broker.locations import has_native_share_groups
from queueflow.errors import BrokerError

#: Seconds the session broker may take from JVM launch to serving (typically ~10 s).
BROKER_START_TIMEOUT_S = 120.0
#: Seconds a topic may take to be created and get leaders.
TOPIC_TIMEOUT_S = 30.0

_TESTS_DIR = Path(__file__).resolve().parent
_INTEGRATION_DIR = _TESTS_DIR / "integration"
#: The slowest files (≥ 60 s of tests each on an idle machine), scheduled first under xdist.
_SLOWEST_FILES = (
    "test_examples.py",
    "test_chaos.py",
    "test_rolling_upgrade.py",
    "test_failover.py",
    "test_redelivery.py",
    "test_kafka_listener.py",
    "test_security_acls.py",
)


def _xdist_rank(item: pytest.Item) -> int:
    """Scheduling rank of ``item``'s file: the slowest files, then the other broker tests, then
    the unit tests (many small files that fill the workers' last minutes evenly)."""
    path = Path(item.path).resolve()
    if path.name in _SLOWEST_FILES:
        return 0
    return 2 if _TESTS_DIR / "unit" in path.parents else 1


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # `make test` hands whole files to two workers in collection order
        # (--dist loadfile --no-loadscope-reorder): the longest first, so neither worker is left
        # with a long file at the end. A stable sort keeps each file's own order.
        items.sort(key=_xdist_rank)
    native = has_native_share_groups() or bool(bootstrap_from_env())
    kept: list[pytest.Item] = []
    deselected: list[pytest.Item] = []
    for item in items:
        if _INTEGRATION_DIR in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.integration)
        if not native and item.get_closest_marker("native_share_groups"):
            # The broker's own share groups don't exist in this release: nothing to compare
            # queueflow with, so these tests don't apply (deselected, not skipped). Everything
            # else runs (queueflow needs no share groups).
            deselected.append(item)
        else:
            kept.append(item)
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = kept


class _SparkOnOneWorker:
    """``--dist loadfile`` with tests/spark as one unit: one worker starts the SparkSession
    (a JVM, ~15 s and ~1 GiB) instead of each."""

    @pytest.hookimpl
    def pytest_xdist_make_scheduler(self, config: pytest.Config, log: object) -> object | None:
        if config.getoption("dist") != "loadfile":
            return None
        from xdist.scheduler import LoadFileScheduling

        class Scheduler(LoadFileScheduling):
            def _split_scope(self, nodeid: str) -> str:
                path = nodeid.split("::", 1)[0]
                return "tests/spark" if path.startswith("tests/spark/") else path

        return Scheduler(config, log)


def pytest_configure(config: pytest.Config) -> None:
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _terminate)
    if config.pluginmanager.hasplugin("xdist"):  # its hooks exist only then
        config.pluginmanager.register(_SparkOnOneWorker(), "queueflow-spark-on-one-worker")


def _terminate(signum: int, frame: object) -> None:
    """SIGTERM: as Ctrl-C, so the session fixtures' teardown stops the brokers and workers."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends it at once
    raise KeyboardInterrupt(f"signal {signum}")


def _say(config: pytest.Config) -> Callable[[str], None]:
    """Print a line past pytest's output capture (the broker's start, a first jar download)."""
    capture = config.pluginmanager.getplugin("capturemanager")

    def say(line: str) -> None:
        if capture is None:
            print(f"queueflow: {line}", file=sys.stderr, flush=True)
            return
        with capture.global_and_fixture_disabled():
            print(f"\nqueueflow: {line}", file=sys.stderr, flush=True)

    return say


def _port_taken(exc: Exception) -> bool:
    """The broker could not bind a port: our check found it taken, or the JVM's bind failed."""
    return isinstance(exc, BrokerError) and "already in use" in str(exc)


@pytest.fixture(scope="session")
def local_broker(
    tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config
) -> Iterator[LocalBroker | None]:
    """The session's LocalBroker (started), or None when ``QUEUEFLOW_BROKER`` is set."""
    if bootstrap_from_env():
        yield None
        return
    data_dir = tmp_path_factory.mktemp("kafka")
    broker: LocalBroker | None = None
    # A free port can be taken between choosing and binding it: choose new ones and retry.
    for attempt in stamina.retry_context(
        on=_port_taken, attempts=3, timeout=None, wait_initial=0, wait_jitter=0
    ):
        with attempt:
            port, controller_port = find_free_ports(2)
            broker = LocalBroker(
                data_dir, port=port, controller_port=controller_port, die_with_parent=True
            )
            try:
                broker.start(timeout_s=BROKER_START_TIMEOUT_S, progress=_say(pytestconfig))
            except BrokerError as exc:
                if not _port_taken(exc):
                    raise
                broker.wipe()  # the storage records the controller port it was formatted with
                data_dir.mkdir(parents=True, exist_ok=True)
                raise
    assert broker is not None
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture(scope="session")
def kafka_bootstrap(local_broker: LocalBroker | None) -> str:
    """Bootstrap ``host:port`` of the Kafka cluster under test."""
    external = bootstrap_from_env()
    if external:
        return external
    assert local_broker is not None
    return local_broker.bootstrap


@pytest.fixture
def topic_factory(kafka_bootstrap: str, request: pytest.FixtureRequest) -> Callable[..., str]:
    """Return ``make(partitions=1, *, prefix=None, config=None) -> topic name``.

    Names are ``qf-<prefix or test name>-<random>``, so nothing needs deleting. ``config`` is a
    mapping of topic configs. Raises BrokerError if the topic has no leaders within
    :data:`TOPIC_TIMEOUT_S` seconds.
    """

    def make(
        partitions: int = 1,
        *,
        prefix: str | None = None,
        config: Mapping[str, str] | None = None,
    ) -> str:
        base = re.sub(r"[^a-zA-Z0-9._-]+", "-", prefix or request.node.name).strip("-")[:80]
        name = f"qf-{base}-{uuid.uuid4().hex[:10]}"
        create_topic(kafka_bootstrap, name, partitions, config=config, timeout_s=TOPIC_TIMEOUT_S)
        return name

    return make
