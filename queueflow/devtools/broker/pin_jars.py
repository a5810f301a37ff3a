"""Regenerating the checked-in jar manifests (:mod:`.manifest`) with Maven: a maintainer's
step when queueflow moves to another Kafka release or changes ``pom.xml``; needs ``mvn`` and
network access. Each jar Maven resolved is checksummed from ``~/.m2`` and checked against the
``.sha1`` Maven Central publishes::

    python -m queueflow.devtools.broker.pin_jars 4.3.1 3.9.1
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from queueflow.devtools.broker.central import central_sha1, repository_url
from queueflow.devtools.broker.manifest import (
    Artifact,
    file_digests,
    format_manifest,
    manifest_path,
    render_pom,
)
from queueflow.errors import BrokerError

__all__ = ["main", "resolve_with_maven"]

#: ``   group:artifact:jar[:classifier]:version:scope:/abs/path.jar`` in dependency:list output.
_LISTED = re.compile(
    r"^\s+([^\s:]+):([^\s:]+):jar:(?:([^\s:]+):)?([^\s:]+):(compile|runtime):(/\S+\.jar)"
)


def resolve_with_maven(version: str) -> list[Artifact]:
    """Resolve ``version``'s jars with ``mvn dependency:list`` and checksum them from ``~/.m2``.

    Raises:
        BrokerError: no ``mvn`` on PATH, or Maven failed (with its output).
    """
    mvn = shutil.which("mvn")
    if mvn is None:
        raise BrokerError("regenerating a manifest needs `mvn` (Apache Maven) on PATH")
    with tempfile.TemporaryDirectory(prefix="queueflow-manifest-") as tmp:
        pom, listing = Path(tmp) / "pom.xml", Path(tmp) / "deps.txt"
        pom.write_text(render_pom(version))
        cmd = [mvn, "-B", "-q", "-Dstyle.color=never", "-f", str(pom), "dependency:list"]
        cmd += ["-DincludeScope=runtime", "-DoutputAbsoluteArtifactFilename=true"]
        cmd += [f"-DoutputFile={listing}"]
        out = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=1800)
        if out.returncode != 0:
            raise BrokerError(f"Maven failed (exit {out.returncode}):\n{out.stdout}{out.stderr}")
        lines = listing.read_text().splitlines()
    artifacts = []
    for line in lines:
        match = _LISTED.match(line)
        if match is None:
            continue
        group, artifact, classifier, ver, _scope, jar = match.groups()
        size, sha1, sha256 = file_digests(Path(jar))
        artifacts.append(Artifact(group, artifact, ver, classifier or "", size, sha1, sha256))
    return artifacts


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m queueflow.devtools.broker.pin_jars VERSION...``: rewrite those manifests."""
    versions = list(sys.argv[1:] if argv is None else argv)
    if not versions:
        print("usage: python -m queueflow.devtools.broker.pin_jars VERSION...", file=sys.stderr)
        return 2
    for version in versions:
        artifacts = resolve_with_maven(version)
        for a in artifacts:  # ~/.m2 holds what Central serves
            url = f"{repository_url()}/{a.path}"
            if central_sha1(url) != a.sha1:
                raise BrokerError(f"{a.file_name} in ~/.m2 differs from {url}.sha1")
        path = manifest_path(version)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(format_manifest(version, artifacts), encoding="utf-8")
        total = sum(a.size for a in artifacts)
        print(f"{path}: {len(artifacts)} jars, {total / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
