"""For a Kafka release without a checked-in jar manifest, Maven resolves the jars (the
releases with one download over HTTP: tests/unit/devtools/test_jar_download.py). The first
resolution of the Kafka jars says what it does: that it resolves, the files and
bytes downloaded so far (with the percentage of the expected total), and the result; Maven's
failures still carry the tail of its output. Maven here is a fake ``mvn`` script printing what
Maven prints in batch mode."""

from __future__ import annotations

import fcntl
import stat
import threading
import time
from pathlib import Path

import pytest

from queueflow.devtools.broker import maven
from queueflow.devtools.broker.locations import KAFKA_VERSION
from queueflow.errors import BrokerError

CENTRAL = "https://repo.maven.apache.org/maven2"
#: What Maven prints in batch mode (an ``[INFO]`` prefix or not, sizes in B/kB/MB).
MAVEN_OUTPUT = [
    "[INFO] Scanning for projects...",
    f"Downloading from central: {CENTRAL}/org/apache/kafka/kafka-clients-V.jar",
    f"Downloaded from central: {CENTRAL}/org/apache/kafka/kafka-clients-V.jar (12 MB at 4 MB/s)",
    f"Downloaded from central: {CENTRAL}/org/apache/kafka/kafka_2.13-V.jar (6.5 MB at 3.1 MB/s)",
    f"[INFO] Downloaded from central: {CENTRAL}/org/slf4j/slf4j-api.jar (69 kB at 1.2 MB/s)",
    f"Downloaded from central: {CENTRAL}/org/lz4/lz4-java-1.8.0.pom (1,535 B at 20 kB/s)",
]
FAKE_MVN = "\n".join(
    [
        "#!/bin/sh",
        'for arg in "$@"; do case "$arg" in -DoutputDirectory=*) out="${arg#*=}";; esac; done',
        *(f'echo "{line}"' for line in MAVEN_OUTPUT),
        '[ -n "$FAIL" ] && { echo "[ERROR] Could not transfer artifact"; exit 1; }',
        'mkdir -p "$out"',
        "printf 'x%.0s' $(seq 1 1000) > \"$out/kafka_2.13-V.jar\"",
        "printf 'x%.0s' $(seq 1 500) > \"$out/kafka-tools-V.jar\"",
        "",
    ]
).replace("V.jar", f"{KAFKA_VERSION}.jar")


@pytest.fixture
def fake_maven(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    mvn = bin_dir / "mvn"
    mvn.write_text(FAKE_MVN)
    mvn.chmod(mvn.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.setenv("QUEUEFLOW_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(maven, "find_java", lambda: "java")
    monkeypatch.setattr(maven, "load_manifest", lambda version: None)  # no manifest: Maven
    monkeypatch.setattr(maven, "PROGRESS_EVERY_S", 0.0)  # a line per downloaded file
    return tmp_path / "cache"


def test_a_first_resolution_says_files_bytes_and_percentage(fake_maven: Path) -> None:
    lines: list[str] = []

    libs = maven.kafka_libs(progress=lines.append)

    assert libs == fake_maven / f"kafka-{KAFKA_VERSION}" / "libs"
    assert lines[0].startswith(f"resolving the Kafka {KAFKA_VERSION} jars with Maven into {libs}")
    approx = maven.APPROX_LIBS_BYTES[KAFKA_VERSION]
    assert "~56 MB to download" in lines[0]
    first = int(100 * 12e6 / approx)
    assert lines[1] == f"  downloading: 1 files, 12.0 MB (~{first} % of ~56 MB)"
    assert lines[2].startswith("  downloading: 2 files, 18.5 MB (~")
    assert lines[4].startswith(
        "  downloading: 4 files, 18.6 MB"
    )  # 1,535 B: a comma in Maven's size
    assert lines[5] == "  downloaded 4 files, 18.6 MB"
    assert lines[6].startswith(f"resolved 2 Kafka {KAFKA_VERSION} jars (0.0 MB) in ")
    assert len(lines) == 7

    again: list[str] = []
    maven.kafka_libs(progress=again.append)
    assert again == []  # resolved once: nothing to say


def test_a_second_process_says_it_waits_for_the_first(fake_maven: Path) -> None:
    home = fake_maven / f"kafka-{KAFKA_VERSION}"
    home.mkdir(parents=True)
    lines: list[str] = []
    with open(home / ".lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # the first process, resolving
        waiter = threading.Thread(target=maven.kafka_libs, args=(lines.append,))
        waiter.start()
        deadline = time.monotonic() + 10
        while not lines:
            assert time.monotonic() < deadline, "the second caller said nothing"
            time.sleep(0.01)
        assert lines == [
            f"another process is resolving the Kafka {KAFKA_VERSION} jars; waiting for it"
        ]
    waiter.join(timeout=30)
    assert not waiter.is_alive()
    assert lines[-1].startswith(f"resolved 2 Kafka {KAFKA_VERSION} jars")


def test_a_failed_resolution_still_shows_mavens_output(
    fake_maven: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAIL", "1")
    lines: list[str] = []

    with pytest.raises(BrokerError, match="Could not transfer artifact") as info:
        maven.kafka_libs(progress=lines.append)

    assert "exit 1" in str(info.value)
    assert lines[-1] == "  downloaded 4 files, 18.6 MB"


def test_without_a_progress_callback_it_logs(
    fake_maven: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level("INFO", logger="queueflow.devtools.broker.maven"):
        maven.kafka_libs()

    messages = [r.getMessage() for r in caplog.records]
    assert messages[0].startswith(f"resolving the Kafka {KAFKA_VERSION} jars")
    assert any(m.startswith("resolved 2 Kafka") for m in messages)
