"""The pinned jar list of each Kafka release the local broker runs: one checked-in manifest per
release (``manifests/kafka-<version>.txt``), so a fresh machine downloads exactly those jars
over HTTP (:mod:`.central`) without Maven.

A manifest line names one jar and its checksums::

    org.apache.kafka:kafka_2.13:4.3.1 6512345 <sha1, 40 hex> <sha256, 64 hex>

(``group:artifact:version[:classifier] bytes sha1 sha256``); ``#`` starts a comment. The set is
what Maven resolves from ``pom.xml`` (next to this module): ``kafka_2.13``, ``kafka-tools`` and,
on Kafka 4, log4j2, with their compile and runtime dependencies. Regenerating one (needs
``mvn`` and network access; it also checks every jar against Maven Central's ``.sha1``)::

    python -m queueflow.devtools.broker.pin_jars 4.3.1 3.9.1
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Iterable
from pathlib import Path

from queueflow.devtools.broker.locations import RESOURCES, uses_log4j2
from queueflow.errors import BrokerError

__all__ = [
    "MANIFESTS",
    "Artifact",
    "file_digests",
    "format_manifest",
    "load_manifest",
    "manifest_path",
    "parse_manifest",
    "pinned_versions",
    "render_pom",
]

#: The directory of the checked-in manifests.
MANIFESTS = RESOURCES / "manifests"

_COORD = re.compile(r"[A-Za-z0-9_.\-]+")
_HEX40 = re.compile(r"[0-9a-f]{40}")
_HEX64 = re.compile(r"[0-9a-f]{64}")


@dataclasses.dataclass(frozen=True)
class Artifact:
    """One jar of a manifest.

    Attributes:
        group: Maven group id, e.g. ``org.apache.kafka``.
        artifact: artifact id, e.g. ``kafka_2.13``.
        version: e.g. ``4.3.1``.
        classifier: e.g. ``linux-x86_64``, or ``""``.
        size: the jar's length in bytes.
        sha1: its SHA-1 (40 lowercase hex digits), as Maven Central's ``.sha1`` files say.
        sha256: its SHA-256 (64 lowercase hex digits).
    """

    group: str
    artifact: str
    version: str
    classifier: str
    size: int
    sha1: str
    sha256: str

    @property
    def coordinate(self) -> str:
        """``group:artifact:version[:classifier]``."""
        tail = f":{self.classifier}" if self.classifier else ""
        return f"{self.group}:{self.artifact}:{self.version}{tail}"

    @property
    def file_name(self) -> str:
        """``artifact-version[-classifier].jar`` (the name Maven's copy-dependencies gives)."""
        tail = f"-{self.classifier}" if self.classifier else ""
        return f"{self.artifact}-{self.version}{tail}.jar"

    @property
    def path(self) -> str:
        """The jar's path under a Maven repository's root (``org/apache/kafka/...jar``)."""
        return f"{self.group.replace('.', '/')}/{self.artifact}/{self.version}/{self.file_name}"


def parse_manifest(text: str, source: str) -> list[Artifact]:
    """Parse a manifest (format in the module docstring).

    Args:
        text: the manifest's text.
        source: where it came from (a path), for error messages.

    Returns:
        Its artifacts, in file order.

    Raises:
        BrokerError: a malformed line or a jar listed twice (the message names ``source``,
            the line number and what was expected).
    """
    artifacts: list[Artifact] = []
    seen: set[str] = set()
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        artifact = _parse_line(line)
        if artifact is None:
            raise BrokerError(
                f"{source}:{number}: expected 'group:artifact:version[:classifier] bytes "
                f"sha1 sha256' (sha1: 40 and sha256: 64 lowercase hex digits), got {raw!r}"
            )
        if artifact.file_name in seen:
            raise BrokerError(f"{source}:{number}: {artifact.file_name} is listed twice")
        seen.add(artifact.file_name)
        artifacts.append(artifact)
    return artifacts


def _parse_line(line: str) -> Artifact | None:
    fields = line.split()
    if len(fields) != 4:
        return None
    coordinate, size, sha1, sha256 = fields
    parts = coordinate.split(":")
    if len(parts) not in (3, 4) or not all(_COORD.fullmatch(p) for p in parts):
        return None
    if not size.isdigit() or not _HEX40.fullmatch(sha1) or not _HEX64.fullmatch(sha256):
        return None
    classifier = parts[3] if len(parts) == 4 else ""
    return Artifact(parts[0], parts[1], parts[2], classifier, int(size), sha1, sha256)


def format_manifest(version: str, artifacts: Iterable[Artifact]) -> str:
    """The text of ``version``'s manifest (sorted by coordinate, with its header comment)."""
    lines = [
        f"# Apache Kafka {version}: the jars of queueflow's local broker and Kafka tools, as Maven",
        "# resolves them from queueflow/devtools/broker/pom.xml (compile and runtime scopes).",
        "# Downloaded from Maven Central and checked against these checksums and Central's .sha1.",
        f"# Regenerate (needs mvn): python -m queueflow.devtools.broker.pin_jars {version}",
        "# group:artifact:version[:classifier] bytes sha1 sha256",
    ]
    for a in sorted(artifacts, key=lambda a: a.coordinate):
        lines.append(f"{a.coordinate} {a.size} {a.sha1} {a.sha256}")
    return "\n".join(lines) + "\n"


def manifest_path(version: str) -> Path:
    """``manifests/kafka-<version>.txt`` next to this module (it may not exist)."""
    return MANIFESTS / f"kafka-{version}.txt"


def pinned_versions() -> list[str]:
    """The Kafka releases with a checked-in manifest, sorted (``["3.9.1", "4.3.1"]``)."""
    return sorted(p.name[len("kafka-") : -len(".txt")] for p in MANIFESTS.glob("kafka-*.txt"))


def load_manifest(version: str) -> tuple[list[Artifact], str] | None:
    """The checked-in manifest of ``version``: (its artifacts, its text), or None if there is
    none (a release queueflow doesn't pin).

    Raises:
        BrokerError: the manifest is malformed.
    """
    path = manifest_path(version)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    return parse_manifest(text, str(path)), text


def file_digests(path: Path) -> tuple[int, str, str]:
    """(size in bytes, SHA-1 hex, SHA-256 hex) of the file at ``path``."""
    sha1, sha256 = hashlib.sha1(), hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            size += len(chunk)
            sha1.update(chunk)
            sha256.update(chunk)
    return size, sha1.hexdigest(), sha256.hexdigest()


def render_pom(version: str) -> str:
    """``pom.xml`` for ``version`` (log4j2 only on Kafka 4+, whose jars need a binding)."""
    text = (RESOURCES / "pom.xml").read_text().replace("@KAFKA_VERSION@", version)
    if not uses_log4j2(version):  # Kafka 3.x logs through its own slf4j-reload4j binding
        begin, end = text.index("<!-- log4j2:begin"), text.index("<!-- log4j2:end -->")
        text = text[:begin] + text[end + len("<!-- log4j2:end -->") :]
    return text
