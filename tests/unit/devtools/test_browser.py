"""``queueflow.devtools.browser.chromium``: found, installed with apt-get as root, or a clear
error saying what to install (never a silent skip)."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest

from queueflow.devtools import browser
from queueflow.errors import ConfigurationError


def test_found_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(browser.shutil, "which", lambda name: f"/usr/bin/{name}")
    assert browser.chromium() == "/usr/bin/chromium"


def test_installed_with_apt_get_as_root(monkeypatch: pytest.MonkeyPatch) -> None:
    installed: list[list[str]] = []

    def which(name: str) -> str | None:
        if name == "apt-get":
            return "/usr/bin/apt-get"
        return "/usr/bin/chromium" if name == "chromium" and installed else None

    def run(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        if "install" in argv:
            installed.append(argv)
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(browser.shutil, "which", which)
    monkeypatch.setattr(browser.os, "geteuid", lambda: 0)
    monkeypatch.setattr(browser.subprocess, "run", run)
    assert browser.chromium() == "/usr/bin/chromium"
    assert installed == [
        ["/usr/bin/apt-get", "install", "-y", "-q", "--no-install-recommends", "chromium"]
    ]


@pytest.mark.parametrize(
    ("apt", "root", "why"),
    [(None, True, "no apt-get"), ("/usr/bin/apt-get", False, "not root")],
)
def test_a_clear_error_when_it_cannot_be_installed(
    monkeypatch: pytest.MonkeyPatch, apt: str | None, root: bool, why: str
) -> None:
    monkeypatch.setattr(browser.shutil, "which", lambda name: apt if name == "apt-get" else None)
    monkeypatch.setattr(browser.os, "geteuid", lambda: 0 if root else 1000)
    with pytest.raises(ConfigurationError) as info:
        browser.chromium()
    message = str(info.value)
    assert why in message
    assert "apt-get install --no-install-recommends chromium" in message


def test_a_failed_apt_get_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        browser.shutil, "which", lambda name: "/usr/bin/apt-get" if name == "apt-get" else None
    )
    monkeypatch.setattr(browser.os, "geteuid", lambda: 0)
    monkeypatch.setattr(
        browser.subprocess,
        "run",
        lambda argv, **kw: subprocess.CompletedProcess(argv, 100, "", "E: Unable to locate"),
    )
    with pytest.raises(ConfigurationError, match=r"exit 100.*Unable to locate"):
        browser.chromium()
