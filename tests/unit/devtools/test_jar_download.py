"""The local broker's jars come over HTTP from a Maven repository, without Maven: exactly the
jars of the checked-in manifest, each verified (size, SHA-1, SHA-256, and the repository's
``.sha1``) before it is kept; an interrupted or failed download keeps what it verified and a
re-run fetches the rest. The repository here is a local HTTP server; one test (named
``network``) downloads one small real jar from Maven Central."""

from __future__ import annotations

import hashlib
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from queueflow.devtools.broker import central, maven
from queueflow.devtools.broker.manifest import (
    Artifact,
    format_manifest,
    load_manifest,
    parse_manifest,
)
from queueflow.devtools.broker.ports import find_free_ports
from queueflow.errors import BrokerError

VERSION = "4.3.1"
SHA1_A = "a" * 40
SHA256_B = "b" * 64


def _artifact(group: str, name: str, version: str, content: bytes) -> Artifact:
    return Artifact(
        group,
        name,
        version,
        "",
        len(content),
        hashlib.sha1(content).hexdigest(),
        hashlib.sha256(content).hexdigest(),
    )


JARS = {
    _artifact("org.example", "alpha", "1.0", b"alpha-jar-bytes" * 1000): b"alpha-jar-bytes" * 1000,
    _artifact("org.example.deep", "beta_2.13", "2.0", b"beta" * 50): b"beta" * 50,
}


class Repository:
    """A Maven repository over HTTP: ``files`` maps URL paths to bodies; ``fail_once`` paths
    answer 503 once; a path in ``after`` is answered only once the path it maps to has been
    served (within 10 s); every request path is recorded."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.fail_once: set[str] = set()
        self.after: dict[str, str] = {}
        self.requests: list[str] = []
        served: set[str] = set()
        changed = threading.Condition()
        repo = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.lstrip("/")
                repo.requests.append(path)
                first = repo.after.get(path)
                if first is not None:
                    with changed:
                        changed.wait_for(lambda: first in served, timeout=10)
                try:
                    self._answer(path)
                finally:
                    with changed:
                        served.add(path)
                        changed.notify_all()

            def _answer(self, path: str) -> None:
                if path in repo.fail_once:
                    repo.fail_once.discard(path)
                    self.send_error(503)
                    return
                body = repo.files.get(path)
                if body is None:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/maven2"
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self.thread.start()

    def publish(self, artifact: Artifact, content: bytes, sha1: str | None = None) -> None:
        self.files[f"maven2/{artifact.path}"] = content
        self.files[f"maven2/{artifact.path}.sha1"] = (sha1 or artifact.sha1).encode()

    def jar_requests(self) -> list[str]:
        return sorted(r.rsplit("/", 1)[1] for r in self.requests if r.endswith(".jar"))

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Repository]:
    """A local repository holding :data:`JARS`, a manifest of them for :data:`VERSION`, a
    scratch cache, and no ``mvn`` (nor anything else) on PATH."""
    repository = Repository()
    for artifact, content in JARS.items():
        repository.publish(artifact, content)
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    (manifests / f"kafka-{VERSION}.txt").write_text(format_manifest(VERSION, JARS))
    monkeypatch.setattr("queueflow.devtools.broker.manifest.MANIFESTS", manifests)
    monkeypatch.setenv("QUEUEFLOW_MAVEN_REPOSITORY", repository.url + "/")
    monkeypatch.setenv("QUEUEFLOW_CACHE_DIR", str(tmp_path / "cache"))
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.setattr(maven, "find_java", lambda: "java")
    monkeypatch.setattr(maven, "PROGRESS_EVERY_S", 0.0)
    monkeypatch.setattr(central, "RETRY_WAIT_INITIAL_S", 0.0)
    monkeypatch.setattr(central, "RETRY_WAIT_JITTER_S", 0.0)
    yield repository
    repository.close()


def _libs(tmp_path: Path) -> Path:
    return tmp_path / "cache" / f"kafka-{VERSION}" / "libs"


# -- the manifest ------------------------------------------------------------------------------


def test_a_manifest_line_names_a_jar_its_size_and_checksums() -> None:
    text = (
        "# a comment\n\n"
        f"org.apache.kafka:kafka_2.13:4.3.1 1621852 {SHA1_A} {SHA256_B}  # trailing comment\n"
        f"com.github.luben:zstd-jni:1.5.6-10:linux-x86_64 12 {SHA1_A} {SHA256_B}\n"
    )

    first, second = parse_manifest(text, "m.txt")

    assert first == Artifact(
        "org.apache.kafka", "kafka_2.13", "4.3.1", "", 1621852, SHA1_A, SHA256_B
    )
    assert first.path == "org/apache/kafka/kafka_2.13/4.3.1/kafka_2.13-4.3.1.jar"
    assert second.classifier == "linux-x86_64"
    assert second.file_name == "zstd-jni-1.5.6-10-linux-x86_64.jar"
    assert parse_manifest(format_manifest("9.9.9", [first, second]), "x") == [second, first]


@pytest.mark.parametrize(
    "line",
    [
        f"org.apache.kafka:kafka_2.13 1 {SHA1_A} {SHA256_B}",  # no version
        f"org.apache.kafka:kafka_2.13:4.3.1 one {SHA1_A} {SHA256_B}",  # size not a number
        f"org.apache.kafka:kafka_2.13:4.3.1 1 {SHA1_A[:-1]} {SHA256_B}",  # short SHA-1
        f"org.apache.kafka:kafka_2.13:4.3.1 1 {SHA1_A.upper()} {SHA256_B}",  # not lowercase
        f"org.apache.kafka:kafka_2.13:4.3.1 1 {SHA1_A}",  # no SHA-256
        f"org/apache:kafka_2.13:4.3.1 1 {SHA1_A} {SHA256_B}",  # a slash in the group
    ],
)
def test_a_malformed_manifest_line_is_an_error_naming_file_and_line(line: str) -> None:
    with pytest.raises(BrokerError, match=r"^kafka-x\.txt:2: expected 'group:artifact:version"):
        parse_manifest(f"# header\n{line}\n", "kafka-x.txt")


def test_a_jar_listed_twice_is_an_error() -> None:
    line = f"a.b:c:1 1 {SHA1_A} {SHA256_B}\n"
    with pytest.raises(BrokerError, match=r"m\.txt:2: c-1\.jar is listed twice"):
        parse_manifest(line + line, "m.txt")


@pytest.mark.parametrize(
    ("version", "own_logging"),
    [("4.3.1", "org.apache.logging.log4j:log4j-core"), ("3.9.1", "org.slf4j:slf4j-reload4j")],
)
def test_the_checked_in_manifests_pin_the_broker_and_tools_jars(
    version: str, own_logging: str
) -> None:
    loaded = load_manifest(version)
    assert loaded is not None
    artifacts, _text = loaded
    coordinates = {a.coordinate.rsplit(":", 1)[0] for a in artifacts}
    assert {"org.apache.kafka:kafka_2.13", "org.apache.kafka:kafka-tools", own_logging} <= (
        coordinates
    )
    assert 80 <= len(artifacts) <= 120
    assert 50e6 < sum(a.size for a in artifacts) < 65e6
    assert load_manifest("4.2.0") is None  # no manifest: Maven resolves that release


# -- downloading -------------------------------------------------------------------------------


def test_a_fresh_cache_gets_exactly_the_manifests_jars_without_maven(
    repo: Repository, tmp_path: Path
) -> None:
    lines: list[str] = []

    libs = maven.kafka_libs(progress=lines.append, version=VERSION)

    assert libs == _libs(tmp_path)
    assert sorted(p.name for p in libs.iterdir()) == sorted(a.file_name for a in JARS)
    for artifact, content in JARS.items():
        assert (libs / artifact.file_name).read_bytes() == content
    assert repo.jar_requests() == sorted(a.file_name for a in JARS)
    assert sum(r.endswith(".jar.sha1") for r in repo.requests) == len(JARS)
    assert lines[0].startswith(f"downloading the Kafka {VERSION} jars from {repo.url} into {libs}")
    assert "2 jars, 0.0 MB, checksums verified" in lines[0]
    assert lines[-1].startswith(f"downloaded 2 Kafka {VERSION} jars (0.0 MB) in ")
    assert not (libs.parent / "libs.partial").exists()

    repo.requests.clear()
    again: list[str] = []
    assert maven.kafka_libs(progress=again.append, version=VERSION) == libs
    assert (again, repo.requests) == ([], [])  # fetched once: no request, nothing said


def test_a_jar_that_differs_from_the_manifest_is_refused_naming_its_url(
    repo: Repository, tmp_path: Path
) -> None:
    beta = next(a for a in JARS if a.artifact == "beta_2.13")
    repo.files[f"maven2/{beta.path}"] = b"tampered" * 25  # same size, other bytes

    with pytest.raises(BrokerError, match="checksum mismatch") as info:
        maven.kafka_libs(version=VERSION)

    assert f"{repo.url}/{beta.path} gave 200 bytes, SHA-1 " in str(info.value)
    assert f"the manifest says 200 bytes, SHA-1 {beta.sha1}" in str(info.value)
    assert not _libs(tmp_path).exists()
    staging = _libs(tmp_path).parent / "libs.partial"
    assert sorted(p.name for p in staging.iterdir()) == ["alpha-1.0.jar"]  # verified, kept


def test_a_published_sha1_that_differs_from_the_manifest_is_refused(
    repo: Repository, tmp_path: Path
) -> None:
    alpha = next(a for a in JARS if a.artifact == "alpha")
    repo.publish(alpha, JARS[alpha], sha1="0" * 40 + "  alpha-1.0.jar\n")

    with pytest.raises(BrokerError, match="checksum mismatch") as info:
        maven.kafka_libs(version=VERSION)

    assert f"{repo.url}/{alpha.path}.sha1 says {'0' * 40}, the manifest says {alpha.sha1}" in (
        str(info.value)
    )
    assert "alpha-1.0.jar" not in repo.jar_requests()  # refused before the jar is fetched
    assert not _libs(tmp_path).exists()


def test_a_missing_sha1_is_an_error_naming_its_url(repo: Repository, tmp_path: Path) -> None:
    alpha = next(a for a in JARS if a.artifact == "alpha")
    del repo.files[f"maven2/{alpha.path}.sha1"]

    with pytest.raises(BrokerError, match=f"GET {repo.url}/{alpha.path}.sha1: HTTP 404"):
        maven.kafka_libs(version=VERSION)
    assert not _libs(tmp_path).exists()


def test_a_rerun_after_a_failure_fetches_only_what_is_missing(
    repo: Repository, tmp_path: Path
) -> None:
    beta = next(a for a in JARS if a.artifact == "beta_2.13")
    alpha = next(a for a in JARS if a.artifact == "alpha")
    content = repo.files.pop(f"maven2/{beta.path}")
    # beta's 404 comes once alpha was served: alpha was on its way when the download failed (on
    # a loaded machine the failure could otherwise cancel alpha's download before it started).
    repo.after[f"maven2/{beta.path}"] = f"maven2/{alpha.path}"
    with pytest.raises(BrokerError, match="HTTP 404"):
        maven.kafka_libs(version=VERSION)
    assert not _libs(tmp_path).exists()

    repo.files[f"maven2/{beta.path}"] = content
    repo.after.clear()
    repo.requests.clear()
    lines: list[str] = []
    libs = maven.kafka_libs(progress=lines.append, version=VERSION)

    assert repo.jar_requests() == [beta.file_name]
    assert "1 jars, 0.0 MB, checksums verified; 1 already here" in lines[0]
    assert sorted(p.name for p in libs.iterdir()) == sorted(a.file_name for a in JARS)


def test_jars_already_in_place_are_checked_not_downloaded(repo: Repository, tmp_path: Path) -> None:
    libs = _libs(tmp_path)  # e.g. resolved by Maven before there were manifests
    libs.mkdir(parents=True)
    for artifact, content in JARS.items():
        (libs / artifact.file_name).write_bytes(content)

    assert maven.kafka_libs(version=VERSION) == libs
    assert repo.requests == []

    (libs.parent / ".resolved").unlink()  # a corrupted jar is replaced
    alpha = next(a for a in JARS if a.artifact == "alpha")
    (libs / alpha.file_name).write_bytes(b"x" * alpha.size)
    maven.kafka_libs(version=VERSION)
    assert repo.jar_requests() == [alpha.file_name]
    assert (libs / alpha.file_name).read_bytes() == JARS[alpha]


def test_a_server_error_is_retried(repo: Repository, tmp_path: Path) -> None:
    alpha = next(a for a in JARS if a.artifact == "alpha")
    repo.fail_once |= {f"maven2/{alpha.path}", f"maven2/{alpha.path}.sha1"}

    libs = maven.kafka_libs(version=VERSION)

    assert (libs / alpha.file_name).read_bytes() == JARS[alpha]
    assert repo.requests.count(f"maven2/{alpha.path}") == 2


def test_offline_is_a_clear_error(
    repo: Repository, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (closed,) = find_free_ports(1)  # nothing listens there
    monkeypatch.setenv("QUEUEFLOW_MAVEN_REPOSITORY", f"http://127.0.0.1:{closed}/maven2")

    with pytest.raises(BrokerError) as info:
        maven.kafka_libs(version=VERSION)

    message = str(info.value)
    assert f"could not download http://127.0.0.1:{closed}/maven2/org/example/" in message
    assert f"after {central.ATTEMPTS} tries: connection refused" in message
    assert "is this machine offline" in message
    assert "QUEUEFLOW_MAVEN_REPOSITORY" in message and "QUEUEFLOW_BROKER=host:port" in message
    assert not _libs(tmp_path).exists()


def test_without_a_manifest_and_without_maven_the_error_says_what_to_do(
    repo: Repository,
) -> None:
    with pytest.raises(BrokerError) as info:
        maven.kafka_libs(version="4.2.0")

    message = str(info.value)
    assert "Kafka 4.2.0 has no jar manifest in queueflow (pinned: 4.3.1; those download" in (
        message
    )
    assert "python -m queueflow.devtools.broker.pin_jars 4.2.0" in message


def test_network_maven_central_serves_one_small_pinned_jar(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The one test that uses the network: slf4j-api 1.7.36 (41 KB) from Maven Central, as
    pinned in the 4.3.1 manifest, verified against it and against Central's ``.sha1``."""
    monkeypatch.delenv("QUEUEFLOW_MAVEN_REPOSITORY", raising=False)
    loaded = load_manifest("4.3.1")
    assert loaded is not None
    (slf4j,) = [a for a in loaded[0] if a.coordinate == "org.slf4j:slf4j-api:1.7.36"]

    count, size = central.download_artifacts([slf4j], tmp_path, lambda line: None, 60.0)

    assert (count, size) == (1, slf4j.size)
    assert central.verified(tmp_path / slf4j.file_name, slf4j)
    assert [p.name for p in tmp_path.iterdir()] == [slf4j.file_name]
