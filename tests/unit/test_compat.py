"""``queueflow._compat``, the one module that uses Faust and aiokafka internals.

Canaries: each internal the seam uses is checked on the installed faust-streaming / aiokafka
(real classes, real objects where they can be built without a broker); when an upgrade removes
or changes one, the test fails naming the internal, the installed version and what to do.

Confinement: the AST of every module under ``queueflow/`` is walked; a private Faust, mode or
aiokafka name used anywhere but ``queueflow/_compat.py`` fails the test.
"""

from __future__ import annotations

import ast
import asyncio
import contextvars
import gc
import importlib
import importlib.metadata
import inspect
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import aiokafka
import faust
import faust.streams
import mode
import mode.threads
import pytest
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.client import AIOKafkaClient
from aiokafka.consumer.group_coordinator import GroupCoordinator
from faust.stores.base import Store
from faust.stores.rocksdb import Store as RocksDBStore
from faust.tables.base import Collection
from faust.tables.recovery import Recovery
from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread, Producer

from queueflow import _compat

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "queueflow"
SEAM = PACKAGE / "_compat.py"
LIBRARIES = ("faust", "mode", "aiokafka")


# --- canaries -------------------------------------------------------------------------------


def check(ok: bool, dist: str, internal: str, used_by: str, detail: str = "") -> None:
    """Fail, saying what to do, when the installed ``dist`` no longer has ``internal``."""
    if ok:
        return
    version = importlib.metadata.version(dist)
    tested = _compat.TESTED[dist]
    pytest.fail(
        f"{dist} {version} no longer has {internal}{f' ({detail})' if detail else ''}, which "
        f"queueflow._compat.{used_by} uses; the canaries cover {dist}{tested}. Either pin "
        f"{dist}{tested} in pyproject.toml, or port queueflow/_compat.py:{used_by} to {dist} "
        f"{version} and update the pin and queueflow._compat.TESTED.",
        pytrace=False,
    )


def params(fn: Any) -> list[str]:
    return list(inspect.signature(fn).parameters)


@pytest.fixture
def app(tmp_path: Path) -> Iterator[faust.App]:
    """A Faust app that never connects (nothing starts it), on an event loop of its own that is
    closed afterwards (Faust's services take the current loop, creating one if need be)."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        yield faust.App(
            "qf-canary", broker="kafka://localhost:1", store="memory://", datadir=tmp_path
        )
    finally:
        asyncio.set_event_loop(None)
        loop.close()


def test_the_pins_are_the_tested_ranges() -> None:
    text = (ROOT / "pyproject.toml").read_text()
    for dist, tested in _compat.TESTED.items():
        pinned = re.search(rf'"{re.escape(dist)}(?:\[[^\]]*\])?([^"]*)"', text)
        assert pinned is not None and pinned.group(1) == tested, (dist, tested)
        version = importlib.metadata.version(dist)
        low, high = re.fullmatch(r">=([\d.]+),<([\d.]+)", tested).groups()  # type: ignore[union-attr]
        as_tuple = [tuple(int(x) for x in v.split(".")) for v in (low, version, high)]
        assert as_tuple[0] <= as_tuple[1] < as_tuple[2], f"{dist} {version} outside {tested}"


def test_canary_faust_consumer_thread(app: faust.App) -> None:
    thread = getattr(app.consumer, "_thread", None)
    if isinstance(thread, mode.threads.ServiceThread):
        thread.thread_loop.close()  # the thread's own loop; the thread never starts
    check(
        isinstance(thread, AIOKafkaConsumerThread),
        "faust-streaming",
        "faust.transport.drivers.aiokafka.Consumer._thread (an AIOKafkaConsumerThread)",
        "group_coordinator / refresh_consumer_metadata",
    )


def test_canary_consumer_thread_ensure_consumer() -> None:
    fn = getattr(AIOKafkaConsumerThread, "_ensure_consumer", None)
    check(
        callable(fn) and params(fn) == ["self"],
        "faust-streaming",
        "AIOKafkaConsumerThread._ensure_consumer()",
        "group_coordinator / refresh_consumer_metadata",
    )


def test_canary_consumer_thread_call_thread() -> None:
    fn = getattr(AIOKafkaConsumerThread, "call_thread", None)
    check(
        inspect.iscoroutinefunction(fn) and params(fn)[:2] == ["self", "fun"],
        "faust-streaming",
        "AIOKafkaConsumerThread.call_thread(fun) (mode's ServiceThread)",
        "refresh_consumer_metadata",
    )


def test_canary_aiokafka_consumer_coordinator_and_client() -> None:
    async def attributes() -> tuple[bool, bool, bool]:
        consumer = aiokafka.AIOKafkaConsumer(bootstrap_servers="localhost:1")
        try:
            client = getattr(consumer, "_client", None)
            refresh = getattr(client, "force_metadata_update", None)
            return (
                hasattr(consumer, "_coordinator"),
                isinstance(client, AIOKafkaClient),
                (callable(refresh)),
            )
        finally:
            await consumer.stop()

    has_coordinator, has_client, has_refresh = asyncio.run(attributes())
    start = inspect.getsource(aiokafka.AIOKafkaConsumer.start)
    check(
        has_coordinator and "self._coordinator = GroupCoordinator(" in start,
        "aiokafka",
        "AIOKafkaConsumer._coordinator (its GroupCoordinator once started)",
        "group_coordinator",
    )
    check(
        has_client and has_refresh,
        "aiokafka",
        "AIOKafkaConsumer._client (an AIOKafkaClient with force_metadata_update())",
        "refresh_consumer_metadata",
    )


def test_canary_group_coordinator_do_heartbeat() -> None:
    fn = getattr(GroupCoordinator, "_do_heartbeat", None)
    routine = inspect.getsource(GroupCoordinator._heartbeat_routine)
    check(
        inspect.iscoroutinefunction(fn) and params(fn) == ["self"],
        "aiokafka",
        "GroupCoordinator._do_heartbeat() (a coroutine returning True on an OK heartbeat)",
        "on_heartbeat_ok",
    )
    check(
        "await self._do_heartbeat()" in routine,
        "aiokafka",
        "GroupCoordinator._heartbeat_routine calling self._do_heartbeat() (looked up on the "
        "instance, so that the wrapper is called)",
        "on_heartbeat_ok",
    )
    check(
        # (getsource of a function: a class's source is found by parsing the whole module)
        "self.generation =" in inspect.getsource(GroupCoordinator.__init__),
        "aiokafka",
        "GroupCoordinator.generation",
        "on_heartbeat_ok",
    )


def test_canary_group_coordinator_do_heartbeat_proves_membership_only_when_accepted() -> None:
    """The membership lease (docs/architecture.md) takes an OK ``_do_heartbeat`` as proof that
    the broker kept the member until the send time plus the session timeout: it must send one
    HeartbeatRequest per call and return True only for an accepted one (NoError), or for
    REBALANCE_IN_PROGRESS after ``request_rejoin()`` (Faust then revokes every partition at
    once, which resets the lease)."""
    src = inspect.getsource(GroupCoordinator._do_heartbeat)
    check(
        "HeartbeatRequest(" in src and src.count("await self._send_req(") == 1,
        "aiokafka",
        "GroupCoordinator._do_heartbeat sending one HeartbeatRequest per call (the time taken "
        "before the call is the request's send time)",
        "on_heartbeat_ok",
    )
    rejoin = src.find("self.request_rejoin()")
    check(
        src.count("return True") == 2
        and src.find("Errors.NoError")
        < src.find("return True")
        < rejoin
        < src.rfind("return True"),
        "aiokafka",
        "GroupCoordinator._do_heartbeat returning True only for NoError, and for "
        "REBALANCE_IN_PROGRESS after request_rejoin()",
        "on_heartbeat_ok (MembershipLease)",
    )


def test_canary_faust_producer_ensure_producer_and_client() -> None:
    fn = getattr(Producer, "_ensure_producer", None)
    check(
        callable(fn) and params(fn) == ["self"],
        "faust-streaming",
        "faust.transport.drivers.aiokafka.Producer._ensure_producer()",
        "refresh_producer_metadata",
    )

    async def client() -> Any:
        producer = aiokafka.AIOKafkaProducer(bootstrap_servers="localhost:1")
        try:
            return getattr(producer, "client", None)
        finally:
            await producer.stop()

    found = asyncio.run(client())
    check(
        isinstance(found, AIOKafkaClient) and callable(found.force_metadata_update),
        "aiokafka",
        "AIOKafkaProducer.client (an AIOKafkaClient with force_metadata_update())",
        "refresh_producer_metadata",
    )


def test_canary_faust_current_event_context_variable() -> None:
    var = getattr(faust.streams, "_current_event", None)
    check(
        isinstance(var, contextvars.ContextVar),
        "faust-streaming",
        "faust.streams._current_event (a ContextVar)",
        "current_event_scope",
    )

    class Event:
        message = None

    event = Event()
    with _compat.current_event_scope(event):
        inside = faust.streams.current_event()
    check(
        inside is event and faust.streams.current_event() is None,
        "faust-streaming",
        "faust.streams.current_event() reading _current_event as a weak reference",
        "current_event_scope",
    )


def test_canary_faust_table_data_is_its_store(app: faust.App) -> None:
    check(
        isinstance(inspect.getattr_static(Collection, "data", None), property),
        "faust-streaming",
        "faust.tables.base.Collection.data (a property)",
        "table_store / set_persisted_offset",
    )
    table = app.Table("canary")
    check(
        isinstance(_compat.table_store(table), Store),
        "faust-streaming",
        "Collection.data returning the table's Store",
        "table_store",
    )


def test_canary_faust_store_set_persisted_offset() -> None:
    for store in (Store, RocksDBStore):
        fn = getattr(store, "set_persisted_offset", None)
        check(
            callable(fn) and params(fn) == ["self", "tp", "offset"],
            "faust-streaming",
            f"{store.__module__}.Store.set_persisted_offset(tp, offset)",
            "set_persisted_offset",
        )


def test_canary_faust_app_extra_services_start_instances(app: faust.App) -> None:
    services = getattr(app, "_extra_services", None)
    check(
        isinstance(services, list),
        "faust-streaming",
        "faust.App._extra_services (a list)",
        "add_service",
    )
    service = mode.Service()
    check(
        app._prepare_subservice(service) is service,
        "faust-streaming",
        "faust.App starting service instances of _extra_services as they are "
        "(App._prepare_subservice)",
        "add_service",
    )
    check(
        "self._extra_services" in inspect.getsource(faust.App.on_started_init_extra_services),
        "faust-streaming",
        "App.on_started_init_extra_services starting _extra_services",
        "add_service",
    )


def test_canary_faust_table_recovery(app: faust.App) -> None:
    recovery = getattr(app.tables, "recovery", None)
    check(
        isinstance(recovery, Recovery)
        and isinstance(recovery.in_recovery, bool)
        and callable(getattr(recovery, "active_remaining_total", None)),
        "faust-streaming",
        "app.tables.recovery (a Recovery with in_recovery and active_remaining_total())",
        "table_recovery",
    )


def test_canary_faust_worker_is_the_beacon_root_and_reraises_its_crash_reason(
    app: faust.App,
) -> None:
    check(
        "self.app.beacon.reattach(self.beacon)"
        in inspect.getsource(faust.Worker.on_init_dependencies),
        "faust-streaming",
        "faust.Worker attaching the app's beacon under its own (app.beacon.root.data)",
        "mark_worker_failed",
    )
    worker = mode.Service()  # stands for the worker: the root of the app's beacon
    app.beacon.reattach(worker.beacon)
    reason = RuntimeError("canary")
    check(
        _compat.mark_worker_failed(app, reason) and worker.crash_reason is reason,
        "mode-streaming",
        "Service.crash_reason, a settable property",
        "mark_worker_failed",
    )
    check(
        "raise self.crash_reason" in inspect.getsource(mode.Worker._shutdown_loop),
        "mode-streaming",
        "mode.Worker._shutdown_loop re-raising crash_reason after the loop closed",
        "mark_worker_failed",
    )
    check(
        not app._crashed.is_set() and not worker._crashed.is_set(),
        "mode-streaming",
        "a Worker's crash_reason set without crashing its services",
        "mark_worker_failed",
    )


def test_mark_worker_failed_without_a_worker(app: faust.App) -> None:
    assert not _compat.mark_worker_failed(app, RuntimeError("no worker"))


def test_canary_aiokafka_fetcher_memory_records_and_python_batch() -> None:
    import aiokafka.consumer.fetcher as fetcher
    from aiokafka.record import default_records

    _compat.tolerate_undecodable_records()
    check(
        getattr(fetcher.MemoryRecords, "queueflow_tolerant", False),
        "aiokafka",
        "aiokafka.consumer.fetcher.MemoryRecords (what the fetcher builds per partition)",
        "tolerate_undecodable_records",
    )
    batch = getattr(default_records, "_DefaultRecordBatchPy", None)
    check(
        batch is not None and params(batch._read_msg)[0] == "self",
        "aiokafka",
        "aiokafka.record.default_records._DefaultRecordBatchPy._read_msg",
        "tolerate_undecodable_records",
    )


@pytest.mark.parametrize(
    ("name", "signature"),
    [("_send_request", ["self", "request", "node_id"]), ("_send_to_controller", None)],
)
def test_canary_aiokafka_admin_private_sends(name: str, signature: list[str] | None) -> None:
    fn = getattr(AIOKafkaAdminClient, name, None)
    expected = signature or ["self", "request"]
    check(
        inspect.iscoroutinefunction(fn) and params(fn) == expected,
        "aiokafka",
        f"AIOKafkaAdminClient.{name}({', '.join(expected[1:])})",
        "admin_send_request" if name == "_send_request" else "admin_send_to_controller",
    )


# --- the seam's functions, on stand-ins -------------------------------------------------------


def test_on_heartbeat_ok_reports_ok_heartbeats_only_with_their_generation() -> None:
    class Coordinator:
        generation = 7
        answers = [True, False, True]

        async def _do_heartbeat(self) -> bool:
            self.generation += 0
            return self.answers.pop(0)

    coordinator = Coordinator()
    seen: list[tuple[int, int]] = []
    _compat.on_heartbeat_ok(coordinator, lambda generation, sent: seen.append((generation, sent)))

    async def beat() -> list[bool]:
        return [await coordinator._do_heartbeat() for _ in range(3)]

    assert asyncio.run(beat()) == [True, False, True]
    assert [g for g, _ in seen] == [7, 7] and all(sent > 0 for _, sent in seen)


def test_current_event_scope_is_reset_after_an_error() -> None:
    class Event:
        pass

    with pytest.raises(KeyError), _compat.current_event_scope(Event()):
        raise KeyError("x")
    assert faust.streams.current_event() is None


def test_table_recovery_of_an_app_that_does_not_recover(app: faust.App) -> None:
    assert _compat.table_recovery(app) == (False, 0)


def test_add_service_appends_the_instance(app: faust.App) -> None:
    service = mode.Service()
    _compat.add_service(app, service)
    assert app._extra_services[-1] is service


def test_admin_sends_go_to_the_private_methods() -> None:
    class Admin:
        async def _send_request(self, request: Any) -> Any:
            return ("any", request)

        async def _send_to_controller(self, request: Any) -> Any:
            return ("controller", request)

    async def both() -> tuple[Any, Any]:
        return (
            await _compat.admin_send_request(Admin(), 1),
            await _compat.admin_send_to_controller(Admin(), 2),
        )

    assert asyncio.run(both()) == (("any", 1), ("controller", 2))


# --- confinement: no private library name outside the seam -----------------------------------


@cache
def library_private_names() -> frozenset[str]:
    """Private names (``_x``, not dunders) that faust, mode and aiokafka define: functions,
    classes, module globals and attributes they assign."""
    names: set[str] = set()
    for library in LIBRARIES:
        origin = importlib.import_module(library).__file__  # faust's module has no __spec__
        assert origin is not None
        for path in Path(origin).parent.rglob("*.py"):
            names |= defined_private_names(parse(path.read_bytes()))
    return frozenset(names)


def parse(source: str | bytes) -> ast.Module:
    """:func:`ast.parse` with the garbage collector paused: CPython 3.11 can raise "AST
    constructor recursion depth mismatch" when a finalizer run by a collection in the middle of
    it parses too (e.g. to format the traceback of an unraisable exception)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return ast.parse(source)
    finally:
        if enabled:
            gc.enable()


def defined_private_names(tree: ast.AST) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            name = node.name
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            name = node.attr
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            name = node.id
        else:
            continue
        if is_private(name):
            out.add(name)
    return out


def is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def seam_names() -> frozenset[str]:
    """The private attributes ``queueflow/_compat.py`` uses: forbidden anywhere else."""
    tree = parse(SEAM.read_text())
    return frozenset(
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and is_private(node.attr)
    )


@cache
def own_private_names() -> frozenset[str]:
    """Private names queueflow defines itself (outside the seam)."""
    names: set[str] = set()
    for path in modules():
        names |= defined_private_names(parse(path.read_text()))
    return frozenset(names)


def modules() -> Iterator[Path]:
    for path in sorted(PACKAGE.rglob("*.py")):
        if path != SEAM:
            yield path


@dataclass(frozen=True)
class Use:
    path: str
    line: int
    code: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.code}"


def root_name(node: ast.expr) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Call, ast.Subscript)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


class PrivateUseFinder(ast.NodeVisitor):
    """Finds, in one module, uses of private Faust/mode/aiokafka names:

    - ``from faust.x import _y``, ``import aiokafka._z`` (a private module or name);
    - ``lib_name._x`` where ``lib_name`` was imported from a library (``faust.streams._x``,
      ``AIOKafkaAdminClient._y``);
    - ``obj._x`` (``obj`` not ``self``/``cls``) for a private name the seam uses, or one the
      libraries define and queueflow does not (``consumer._thread``, ``admin._send_request``);
    - ``self._x`` in a class that subclasses a library class, for a library private name the
      class does not define itself (``self._extra_services`` in a ``faust.App`` subclass);
    - ``getattr(obj, "_x")`` / ``setattr`` / ``hasattr`` / ``delattr`` of such a name.
    """

    def __init__(self, path: str, forbidden: frozenset[str], library: frozenset[str]) -> None:
        self.path = path
        self.forbidden = forbidden  # names flagged on any object but self/cls
        self.library = library  # names flagged on self in a library subclass
        self.imported: set[str] = set()  # names bound by imports from the libraries
        self.classes: list[tuple[bool, set[str]]] = []  # (subclasses a library class, own)
        self.uses: list[Use] = []

    def flag(self, node: ast.AST) -> None:
        self.uses.append(Use(self.path, getattr(node, "lineno", 0), ast.unparse(node)))

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name.split(".")[0] in LIBRARIES:
                if any(is_private(part) for part in alias.name.split(".")):
                    self.flag(node)
                self.imported.add((alias.asname or alias.name).split(".")[0])

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        if module.split(".")[0] in LIBRARIES and not node.level:
            if any(is_private(p) for p in module.split(".")) or any(
                is_private(a.name) for a in node.names
            ):
                self.flag(node)
            self.imported.update(a.asname or a.name for a in node.names)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        subclass = any(root_name(base) in self.imported for base in node.bases)
        self.classes.append((subclass, defined_private_names(node)))
        self.generic_visit(node)
        self.classes.pop()

    def visit_Attribute(self, node: ast.Attribute) -> None:
        name = node.attr
        if is_private(name):
            base = node.value
            if isinstance(base, ast.Name) and base.id in ("self", "cls"):
                if self.classes and self.classes[-1][0]:
                    subclass_own = self.classes[-1][1]
                    if name in self.library and name not in subclass_own:
                        self.flag(node)
            elif root_name(base) in self.imported or name in self.forbidden:
                self.flag(node)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if (
            isinstance(func, ast.Name)
            and func.id in ("getattr", "setattr", "hasattr", "delattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
            and node.args[1].value in self.forbidden
        ):
            self.flag(node)
        self.generic_visit(node)


def private_uses(source: str, path: str) -> list[Use]:
    library = library_private_names()
    forbidden = seam_names() | (library - own_private_names())
    finder = PrivateUseFinder(path, forbidden, library)
    finder.visit(parse(source))
    return finder.uses


def test_no_private_faust_mode_or_aiokafka_name_outside_the_seam() -> None:
    found = [
        use
        for path in modules()
        for use in private_uses(path.read_text(), str(path.relative_to(ROOT)))
    ]
    assert not found, (
        "private Faust/mode/aiokafka names used outside queueflow/_compat.py (add a small, "
        "documented function there, with a canary in tests/unit/test_compat.py, and call it):\n"
        + "\n".join(map(str, found))
    )


@pytest.mark.parametrize(
    "code",
    [
        "async def f(consumer):\n    return consumer._thread._ensure_consumer()._coordinator\n",
        "async def f(admin, r):\n    return await admin._send_request(r)\n",
        "async def f(admin, r):\n    return await admin._send_to_controller(r)\n",
        "import faust.streams\nfaust.streams._current_event.set(None)\n",
        "from faust.streams import _current_event\n",
        "from aiokafka.admin import AIOKafkaAdminClient\nAIOKafkaAdminClient._send_request\n",
        "def f(app, s):\n    app._extra_services.append(s)\n",
        "def f(app):\n    return getattr(app.consumer, '_thread', None)\n",
        "def f(producer):\n    return producer._ensure_producer().client\n",
        "def f(coordinator):\n    coordinator._do_heartbeat = None\n",
        "import faust\nclass A(faust.App):\n    def f(self):\n"
        "        return self._extra_services\n",
    ],
)
def test_the_confinement_check_catches(code: str) -> None:
    assert private_uses(code, "queueflow/kafka/admin.py"), code


@pytest.mark.parametrize(
    "code",
    [
        "class A:\n    def f(self):\n        return self._thread\n",  # queueflow's own
        "import faust\nclass A(faust.App):\n    _mine = 1\n    def f(self):\n"
        "        return self._mine\n",
        "def f(store):\n    return store.data\n",
    ],
)
def test_the_confinement_check_lets_through(code: str) -> None:
    assert private_uses(code, "queueflow/x.py") == []


def test_canary_faust_consumer_scheduler_iterates_fetched_records(app: faust.App) -> None:
    """``filter_consumer_records``: Faust's consumer passes each fetched ``{tp: [record]}``
    through ``Consumer.scheduler.iterate`` (faust/transport/consumer.py ``getmany``), and
    ``App._consumer`` holds the consumer once created."""
    import inspect

    import faust.transport.consumer as faust_consumer

    assert not _compat.filter_consumer_records(app, lambda tp, rs: rs, "m")  # not created yet
    consumer = app.consumer
    thread = getattr(consumer, "_thread", None)
    if isinstance(thread, mode.threads.ServiceThread):
        thread.thread_loop.close()
    source = inspect.getsource(faust_consumer.Consumer.getmany)
    check(
        "self.scheduler.iterate(records)" in source and app._consumer is consumer,
        "faust-streaming",
        "faust.transport.consumer.Consumer.getmany calls self.scheduler.iterate(records)",
        "filter_consumer_records",
    )


def test_filter_consumer_records_drops_what_keep_leaves_out_and_is_idempotent(
    app: faust.App,
) -> None:
    from faust.types import TP

    consumer = app.consumer
    thread = getattr(consumer, "_thread", None)
    if isinstance(thread, mode.threads.ServiceThread):
        thread.thread_loop.close()

    def keep(tp: Any, records: list[Any]) -> list[Any]:
        return [r for r in records if r != "junk"] if tp.topic == "req" else records

    assert _compat.filter_consumer_records(app, keep, "qf")
    wrapped = consumer.scheduler
    assert _compat.filter_consumer_records(app, keep, "qf")
    assert consumer.scheduler is wrapped  # not wrapped twice
    records = {TP("req", 0): ["a", "junk", "b"], TP("other", 0): ["junk"]}
    assert sorted(r for _tp, r in consumer.scheduler.iterate(records)) == ["a", "b", "junk"]
