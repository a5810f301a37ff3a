"""The local broker: one KRaft node (broker + controller) in a detached JVM.

Renders its configuration, formats its storage (with ``share.version=1``) once, launches,
stops, kills and wipes it, and reports its status.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import datetime
import json
import logging
import os
import re
import shlex
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from queueflow.devtools.broker.java import find_java, jvm_opts_from_env
from queueflow.devtools.broker.locations import (
    ENV_BROKER,
    ENV_BROKER_JVM_OPTS,
    KAFKA_VERSION,
    RESOURCES,
    has_native_share_groups,
    uses_log4j2,
)
from queueflow.devtools.broker.logtail import LOG_TAIL_LINES, file_size, tail_file, tail_text
from queueflow.devtools.broker.maven import kafka_libs
from queueflow.devtools.broker.ports import PortInUseError, port_in_use
from queueflow.devtools.broker.probe import SHARE_VERSION, probe
from queueflow.devtools.broker.secure import BrokerSecurity
from queueflow.devtools.broker.tools import log4j_option, run_kafka_tool
from queueflow.devtools.children import parent_death_signal
from queueflow.errors import BrokerError

__all__ = ["DEFAULT_BROKER_JVM_OPTS", "BrokerStatus", "LocalBroker"]

log = logging.getLogger(__name__)

#: Broker JVM options unless ``QUEUEFLOW_BROKER_JVM_OPTS`` is set (split like a shell would).
DEFAULT_BROKER_JVM_OPTS = "-Xms256m -Xmx768m -XX:+UseSerialGC"


@dataclasses.dataclass(frozen=True)
class BrokerStatus:
    """A snapshot of a :class:`LocalBroker`.

    Attributes:
        pid: the JVM's process id, or None if not running.
        running: the JVM process is alive.
        serving: it answers Kafka requests (ApiVersions + metadata listing a live broker).
        share_version: the finalized ``share.version`` level, or None if unknown/not serving.
        bootstrap: ``"127.0.0.1:<port>"``.
        data_dir: the broker's data directory.
        log_path: the broker's log4j log file.
        formatted: the KRaft storage has been formatted.
    """

    pid: int | None
    running: bool
    serving: bool
    share_version: int | None
    bootstrap: str
    data_dir: Path
    log_path: Path
    formatted: bool


class LocalBroker:
    """A single-node KRaft Kafka broker (combined broker + controller) in a detached JVM.

    Layout of ``data_dir``: ``server.properties`` and ``log4j2.properties`` (rendered from the
    templates next to this module on every start), ``kraft-combined-logs/`` (``log.dirs``),
    ``broker.log`` (log4j), ``broker.out`` (JVM stdout/stderr), ``broker.pid`` and
    ``queueflow-broker.json`` (cluster id and ports used to format).

    The storage is formatted (with ``share.version=1``) only on the first start, so
    ``stop()``/``start()`` and ``kill()``/``start()`` keep topics, offsets and share-group state.
    The broker keeps running after this Python process exits (call :meth:`stop`), unless
    ``die_with_parent`` is set.

    Args:
        data_dir: data directory (created if missing).
        port: PLAINTEXT listener port on 127.0.0.1.
        controller_port: KRaft controller listener port on 127.0.0.1. It is recorded at format
            time and must stay the same for that data directory.
        extra_config: broker configs overriding or added to ``server.properties``, e.g.
            ``{"group.share.record.lock.duration.ms": "1000"}``; applied on every start.
        jvm_opts: broker JVM options; default ``$QUEUEFLOW_BROKER_JVM_OPTS`` or
            :data:`DEFAULT_BROKER_JVM_OPTS`.
        security: the secured mode (SASL_SSL and mTLS listeners, StandardAuthorizer, SCRAM
            users added at format time, certificates generated at the first start); see
            :mod:`queueflow.devtools.broker.secure`. The PLAINTEXT listener stays, for the
            readiness probe, and gets no ACLs.
        die_with_parent: on Linux, the JVM gets SIGTERM (a controlled shutdown) when the thread
            that started it dies, even by SIGKILL (see :mod:`queueflow.devtools.children`):
            for test sessions and example runs, whose broker must not outlive them. Off for
            ``queueflow broker start``, whose broker is meant to.
    """

    def __init__(
        self,
        data_dir: Path,
        port: int = 9092,
        controller_port: int = 9093,
        extra_config: Mapping[str, str] | None = None,
        *,
        jvm_opts: Sequence[str] | None = None,
        security: BrokerSecurity | None = None,
        die_with_parent: bool = False,
    ) -> None:
        if port == controller_port:
            raise BrokerError(f"port and controller_port must differ (both {port})")
        self.data_dir = Path(data_dir).expanduser().absolute()
        self.port = int(port)
        self.controller_port = int(controller_port)
        self.extra_config: dict[str, str] = {
            str(k): str(v) for k, v in (extra_config or {}).items()
        }
        self.jvm_opts = list(jvm_opts) if jvm_opts is not None else None
        self.security = security
        self.die_with_parent = die_with_parent
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_offsets: tuple[int, int] = (0, 0)  # sizes of broker.log/.out at launch

    def __repr__(self) -> str:
        return f"LocalBroker(data_dir={str(self.data_dir)!r}, bootstrap={self.bootstrap!r})"

    def __enter__(self) -> LocalBroker:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- paths -----------------------------------------------------------------------------

    @property
    def bootstrap(self) -> str:
        """The bootstrap address clients use: ``"127.0.0.1:<port>"``."""
        return f"127.0.0.1:{self.port}"

    @property
    def sasl_bootstrap(self) -> str:
        """The SASL_SSL listener's address, ``"127.0.0.1:<sasl_port>"`` (secured mode only).

        Raises:
            BrokerError: the broker was made without ``security``.
        """
        if self.security is None:
            raise BrokerError(f"{self!r} has no secured mode (LocalBroker(security=...))")
        return f"127.0.0.1:{self.security.sasl_port}"

    @property
    def ssl_bootstrap(self) -> str:
        """The mTLS listener's address, ``"127.0.0.1:<ssl_port>"`` (secured mode only).

        Raises:
            BrokerError: the broker was made without ``security``.
        """
        if self.security is None:
            raise BrokerError(f"{self!r} has no secured mode (LocalBroker(security=...))")
        return f"127.0.0.1:{self.security.ssl_port}"

    @property
    def log_path(self) -> Path:
        """The broker's log4j log file (``<data_dir>/broker.log``)."""
        return self.data_dir / "broker.log"

    @property
    def stdout_path(self) -> Path:
        """The JVM's stdout/stderr (``<data_dir>/broker.out``): crashes before logging starts."""
        return self.data_dir / "broker.out"

    @property
    def pid_path(self) -> Path:
        """The pid file (``<data_dir>/broker.pid``), present while the broker runs."""
        return self.data_dir / "broker.pid"

    @property
    def config_path(self) -> Path:
        """The rendered ``server.properties``."""
        return self.data_dir / "server.properties"

    @property
    def log_dirs(self) -> Path:
        """Kafka's ``log.dirs``: the topic data and the KRaft metadata log."""
        return self.data_dir / "kraft-combined-logs"

    @property
    def _log4j_path(self) -> Path:
        return self.data_dir / ("log4j2.properties" if uses_log4j2() else "log4j.properties")

    @property
    def _meta_path(self) -> Path:
        return self.data_dir / "queueflow-broker.json"

    # -- state -----------------------------------------------------------------------------

    def is_formatted(self) -> bool:
        """Return True if the KRaft storage in :attr:`log_dirs` has been formatted."""
        return (self.log_dirs / "meta.properties").is_file()

    def pid(self) -> int | None:
        """Return the running broker JVM's pid, or None (a stale pid file is removed)."""
        try:
            pid = int(self.pid_path.read_text().strip())
        except (OSError, ValueError):
            return None
        if self._proc is not None and self._proc.pid == pid:
            if self._proc.poll() is None:  # launched by us; may not have exec'd java yet
                return pid
        elif _pid_alive(pid) and self._is_our_process(pid):
            return pid
        with contextlib.suppress(OSError):
            self.pid_path.unlink()
        return None

    def is_running(self) -> bool:
        """Return True if the broker JVM is alive (it may not be serving yet)."""
        return self.pid() is not None

    def status(self, timeout_s: float = 3.0) -> BrokerStatus:
        """Return a :class:`BrokerStatus`; probing takes at most ~2 x ``timeout_s`` seconds."""
        pid = self.pid()
        serving, level = False, None
        if pid is not None:
            serving, level, _ = probe(self.bootstrap, timeout_s)
        return BrokerStatus(
            pid=pid,
            running=pid is not None,
            serving=serving,
            share_version=level if serving else None,
            bootstrap=self.bootstrap,
            data_dir=self.data_dir,
            log_path=self.log_path,
            formatted=self.is_formatted(),
        )

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """Return the last ``lines`` lines of the broker log and of the JVM's stdout/stderr.

        After a launch by this object, only what that run wrote is shown.
        """
        log_start, out_start = self._log_offsets
        log_text = tail_file(self.log_path, lines, log_start) or "(nothing logged)"
        parts = [f"--- last {lines} lines of {self.log_path} ---", log_text]
        out = tail_file(self.stdout_path, lines, out_start)
        if out.strip():
            parts += [f"--- last lines of {self.stdout_path} (JVM stdout/stderr) ---", out]
        return "\n".join(parts)

    # -- lifecycle -------------------------------------------------------------------------

    def start(self, timeout_s: float = 90, progress: Callable[[str], None] | None = None) -> None:
        """Start the broker (formatting storage on first use) and wait until it serves.

        Returns once the broker answers requests, its metadata lists it as a live broker and
        ``share.version`` >= 1 is finalized. If it is already running, only waits for that.
        Resolves the Kafka jars first if needed (see :func:`kafka_libs`; not counted in
        ``timeout_s``).

        Args:
            timeout_s: seconds from JVM launch until it must serve (typically ~10 s).
            progress: where to say what it is doing (resolving the jars, with bytes
                downloaded; launching; serving after how many seconds), one line a call, e.g.
                ``print``; None: the ``queueflow.devtools.broker`` logger (INFO).

        Raises:
            BrokerError: Java/Maven missing, a port in use, formatting failed, the JVM exited,
                or it was not serving within ``timeout_s``. The message includes the last
                ~40 lines of the broker log; a JVM started by this call is killed first.
        """
        if self.pid() is not None:
            running_port = self._configured_port()
            if running_port not in (None, self.port):
                raise BrokerError(
                    f"the broker in {self.data_dir} is already running on port {running_port}, "
                    f"not {self.port}; stop it first or use port {running_port}."
                )
            log.info(
                "Kafka broker in %s is already running; waiting until it serves", self.data_dir
            )
            self._wait_serving(time.monotonic() + timeout_s, timeout_s)
            return
        say = progress or log.info
        launched = time.monotonic()
        self.launch(progress, timeout_s)
        try:
            self._wait_serving(time.monotonic() + timeout_s, timeout_s)
        except BrokerError:
            self.kill()
            raise
        say(f"Kafka broker serving on {self.bootstrap} after {time.monotonic() - launched:.1f} s")

    def launch(self, progress: Callable[[str], None] | None = None, timeout_s: float = 90) -> None:
        """Format the storage on first use and launch the JVM; do not wait until it serves.

        :meth:`start` is this plus the wait;
        :class:`~queueflow.devtools.broker.cluster.LocalCluster` launches its brokers together
        and then waits for each. The JVM belongs to the calling
        thread when ``die_with_parent`` is set (see :mod:`queueflow.devtools.children`).

        Args:
            progress: as for :meth:`start`.
            timeout_s: only quoted in the progress line (the bound :meth:`start` waits).

        Raises:
            BrokerError: Java or the jars missing, a port in use, formatting failed.
        """
        say = progress or log.info
        java = find_java()
        libs = kafka_libs(progress)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._check_format_ports()
        if self.security is not None and (
            not self.is_formatted() or not self.security.ca_path.is_file()
        ):
            self.security.generate()
        for port in self._listen_ports():
            if port_in_use(port):
                raise PortInUseError(
                    f"port {port} on 127.0.0.1 is already in use (another Kafka broker?). Stop "
                    f"it, choose other ports (--port/--controller-port), or set "
                    f"{ENV_BROKER}=host:port to use a running cluster."
                )
        self._write_configs()
        if not self.is_formatted():
            say(f"formatting the broker's KRaft storage in {self.log_dirs} (first start)")
            self._format()
        say(
            f"starting the Kafka {KAFKA_VERSION} {self._describe()} (JVM launch until it "
            f"serves: ~10 s, at most {timeout_s:g} s; log: {self.log_path})"
        )
        self._launch(java, libs)

    def stop(self, timeout_s: float = 30) -> None:
        """Stop the broker: SIGTERM (controlled shutdown), then SIGKILL after ``timeout_s``.

        Idempotent: does nothing if it is not running.

        Args:
            timeout_s: seconds to wait for a clean exit before SIGKILL.

        Raises:
            BrokerError: the process survived SIGKILL for 10 s (should not happen).
        """
        pid = self.pid()
        if pid is None:
            return
        log.info("Stopping Kafka broker pid %d (%s)", pid, self.data_dir)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        if not self._wait_exit(pid, timeout_s):
            log.warning("Kafka broker pid %d ignored SIGTERM for %s s; killing it", pid, timeout_s)
            self.kill()
            return
        self._forget(pid)

    def kill(self) -> None:
        """Kill the broker JVM with SIGKILL (a crash, for chaos tests); idempotent.

        The data survives; :meth:`start` recovers the logs and resumes.

        Raises:
            BrokerError: the process was still alive 10 s after SIGKILL.
        """
        pid = self.pid()
        if pid is None:
            return
        log.info("Killing Kafka broker pid %d (%s)", pid, self.data_dir)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        if not self._wait_exit(pid, 10):
            raise BrokerError(f"Kafka broker pid {pid} survived SIGKILL for 10 s")
        self._forget(pid)

    def wipe(self) -> None:
        """Stop the broker and delete :attr:`data_dir` (all topics and state).

        Raises:
            BrokerError: ``data_dir`` is not empty and does not look like a broker data
                directory (a safety check against deleting the wrong directory).
        """
        self.stop()
        if not self.data_dir.exists():
            return
        ours = {"server.properties", "kraft-combined-logs", "broker.log", "queueflow-broker.json"}
        entries = {p.name for p in self.data_dir.iterdir()}
        if entries and not entries & ours:
            raise BrokerError(
                f"refusing to delete {self.data_dir}: it does not look like a queueflow broker "
                f"data directory (no {', '.join(sorted(ours))})"
            )
        shutil.rmtree(self.data_dir)

    # -- internals -------------------------------------------------------------------------

    def _listen_ports(self) -> list[int]:
        """The ports this node binds (checked free before a launch)."""
        ports = [self.port, self.controller_port]
        if self.security is not None:
            ports += [self.security.sasl_port, self.security.ssl_port]
        return ports

    def _describe(self) -> str:
        """How progress lines name this node."""
        return f"broker on {self.bootstrap}"

    def _check_format_ports(self) -> None:
        if not self.is_formatted():
            return
        try:
            meta = json.loads(self._meta_path.read_text())
        except (OSError, ValueError):
            return
        formatted_port = meta.get("controller_port")
        if formatted_port not in (None, self.controller_port):
            raise BrokerError(
                f"{self.data_dir} was formatted with controller port {formatted_port}, which is "
                f"part of the stored KRaft quorum; start with controller_port={formatted_port} "
                f"(--controller-port {formatted_port}) or wipe it (--fresh)."
            )

    def _configured_port(self) -> int | None:
        """The PLAINTEXT port in the rendered server.properties (what a running JVM uses)."""
        try:
            text = self.config_path.read_text()
        except OSError:
            return None
        match = re.search(r"^listeners=.*PLAINTEXT://[^:,]+:(\d+)", text, re.MULTILINE)
        return int(match.group(1)) if match else None

    def _write_configs(self) -> None:
        tokens = {
            "PORT": str(self.port),
            "CONTROLLER_PORT": str(self.controller_port),
            "LOG_DIRS": str(self.log_dirs),
        }
        overrides = dict(self.extra_config)
        if self.security is not None:
            overrides = {
                **self.security.broker_config(self.port, self.controller_port),
                **overrides,
            }
        server = _override_properties(_render("server.properties", tokens), overrides)
        self.config_path.write_text(server)
        log4j = _render(self._log4j_path.name, {"LOG_FILE": str(self.log_path)})
        self._log4j_path.write_text(log4j)

    def _format(self) -> None:
        cluster_id = _random_cluster_id()
        log.info("Formatting KRaft storage in %s (cluster id %s)", self.log_dirs, cluster_id)
        proc = run_kafka_tool(
            "kafka.tools.StorageTool",
            [
                "format",
                "--standalone",
                "-t",
                cluster_id,
                "-c",
                str(self.config_path),
                *(["--feature", f"{SHARE_VERSION}=1"] if has_native_share_groups() else []),
                *(self.security.format_args() if self.security is not None else []),
            ],
        )
        if proc.returncode != 0:
            raise BrokerError(
                f"formatting KRaft storage in {self.log_dirs} failed (exit {proc.returncode}):\n"
                f"{tail_text(proc.stdout + proc.stderr, LOG_TAIL_LINES)}"
            )
        meta = {
            "kafka_version": KAFKA_VERSION,
            "cluster_id": cluster_id,
            "port": self.port,
            "controller_port": self.controller_port,
            "formatted_at": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        }
        self._meta_path.write_text(json.dumps(meta, indent=2) + "\n")

    def _launch(self, java: str, libs: Path) -> None:
        opts = self.jvm_opts
        if opts is None:
            opts = jvm_opts_from_env(ENV_BROKER_JVM_OPTS, DEFAULT_BROKER_JVM_OPTS)
        cmd = [
            java,
            *opts,
            "-Djava.awt.headless=true",
            log4j_option(self._log4j_path),
            "-cp",
            f"{libs}/*",
            "kafka.Kafka",
            str(self.config_path),
        ]
        self._log_offsets = (file_size(self.log_path), file_size(self.stdout_path))
        with open(self.stdout_path, "ab") as out:
            stamp = datetime.datetime.now().isoformat(timespec="seconds")
            out.write(f"\n=== {stamp} queueflow: {shlex.join(cmd)}\n".encode())
            out.flush()
            self._proc = subprocess.Popen(
                cmd,
                cwd=self.data_dir,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # detached: Ctrl-C in the caller does not reach it
                preexec_fn=parent_death_signal() if self.die_with_parent else None,
            )
        self.pid_path.write_text(f"{self._proc.pid}\n")

    def _wait_serving(self, deadline: float, timeout_s: float) -> None:
        detail = "no answer yet"
        while True:
            pid = self.pid()
            if pid is None:
                code = self._proc.poll() if self._proc is not None else None
                raise BrokerError(
                    f"Kafka broker in {self.data_dir} exited (code {code}) before serving on "
                    f"{self.bootstrap}.\n{self.log_tail()}"
                )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise BrokerError(
                    f"Kafka broker pid {pid} was not serving on {self.bootstrap} with "
                    f"{SHARE_VERSION}>=1 within {timeout_s} s (last probe: {detail}).\n"
                    f"{self.log_tail()}"
                )
            serving, level, detail = probe(self.bootstrap, min(3.0, max(remaining, 0.5)))
            if serving and (not has_native_share_groups() or (level is not None and level >= 1)):
                return  # (a Kafka without share groups serves queueflow all the same)
            if serving:
                detail = f"serving, but {SHARE_VERSION} is {level} (need >= 1)"
            time.sleep(min(0.3, max(deadline - time.monotonic(), 0)))

    def _alive(self, pid: int) -> bool:
        if self._proc is not None and self._proc.pid == pid:
            return self._proc.poll() is None
        return _pid_alive(pid)

    def _is_our_process(self, pid: int) -> bool:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            return True  # no /proc (macOS): trust the pid file
        return "kafka.Kafka" in cmdline and str(self.config_path) in cmdline

    def _wait_exit(self, pid: int, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while self._alive(pid):
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)
        return True

    def _forget(self, pid: int) -> None:
        with contextlib.suppress(OSError):
            if self.pid_path.read_text().strip() == str(pid):
                self.pid_path.unlink()
        if self._proc is not None and self._proc.pid == pid:
            self._proc = None


def _pid_alive(pid: int) -> bool:
    with contextlib.suppress(ChildProcessError):
        reaped, _ = os.waitpid(pid, os.WNOHANG)  # our child: reap it if it exited
        if reaped == pid:
            return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state not in ("Z", "X")


def _render(template: str, tokens: Mapping[str, str]) -> str:
    text = (RESOURCES / template).read_text()
    for key, value in tokens.items():
        text = text.replace(f"@{key}@", value)
    return text


def _override_properties(text: str, overrides: Mapping[str, str]) -> str:
    """Replace ``key=value`` lines of a properties text and append keys it lacks."""
    for key, value in overrides.items():
        if "\n" in key or "\n" in value or "=" in key:
            raise BrokerError(f"invalid broker config {key!r}={value!r}")
    remaining = dict(overrides)
    lines = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith(("#", "!")) and "=" in stripped:
            key = stripped.split("=", 1)[0].strip()
            if key in remaining:
                line = f"{key}={remaining.pop(key)}"
        lines.append(line)
    if remaining:
        lines.append("")
        lines.append("# extra_config")
        lines.extend(f"{key}={value}" for key, value in remaining.items())
    return "\n".join(lines) + "\n"


def _random_cluster_id() -> str:
    """A Kafka cluster id: 16 random bytes, URL-safe base64 without padding (22 characters)."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cid.startswith("-"):  # as Kafka's Uuid.randomUuid(): ids never start with '-'
            return cid
