"""Unknown names are refused with a did-you-mean, never ignored: ``QUEUEFLOW_*`` environment
variables, share-group setting names, and keyword arguments of ``App``, ``share_agent``,
``attach`` and ``ShareConsumer`` (docs/configuration.md "What is refused")."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest

import queueflow
from queueflow.errors import ConfigurationError, UnknownNameError, UnknownNameWarning
from queueflow.settings import (
    ENVIRONMENT,
    SETTINGS,
    ShareGroupSettings,
    check_environment,
    known_environment,
)

ROOT = Path(__file__).resolve().parents[2]


def test_misspelt_environment_variable_is_refused_with_the_closest_name() -> None:
    with pytest.raises(UnknownNameError) as info:
        ShareGroupSettings.load(env={"QUEUEFLOW_SHARE_DELIVERY_COUNT_LIMT": "3"})
    message = str(info.value)
    assert "$QUEUEFLOW_SHARE_DELIVERY_COUNT_LIMT (did you mean " in message
    assert "$QUEUEFLOW_GROUP_SHARE_DELIVERY_COUNT_LIMIT" in message
    assert "rename or unset it" in message


def test_a_suffix_of_a_setting_suggests_it() -> None:
    with pytest.raises(UnknownNameError, match=r"GROUP_SHARE_RECORD_LOCK_DURATION_MS\?"):
        check_environment({"QUEUEFLOW_LOCK_DURATION_MS": "5000"})


def test_every_unknown_variable_is_named_at_once_and_others_are_ignored() -> None:
    with pytest.raises(ConfigurationError) as info:
        check_environment({"QUEUEFLOW_ROLLE": "member", "QUEUEFLOW_XYZ": "1", "PATH": "/bin"})
    message = str(info.value)
    assert message.startswith("unknown environment variables $QUEUEFLOW_ROLLE (did you mean ")
    assert "$QUEUEFLOW_ROLE?" in message and "$QUEUEFLOW_XYZ:" in message
    assert "PATH" not in message


def test_known_variables_pass() -> None:
    check_environment({name: "x" for name in known_environment()})
    check_environment({"FAUST_BROKER": "x", "QUEUEFLOWX": "y"})


def test_every_setting_has_its_variable_known() -> None:
    assert {s.env for s in SETTINGS} <= known_environment()


def test_the_environment_of_the_process_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUEUEFLOW_GROUP_SHARE_DELIVERY_COUNT_LIMT", "3")
    with pytest.raises(UnknownNameError, match="GROUP_SHARE_DELIVERY_COUNT_LIMIT"):
        ShareGroupSettings.load()


def test_unknown_setting_name_suggests_the_closest() -> None:
    with pytest.raises(UnknownNameError) as info:
        ShareGroupSettings.load({"group.share.delivery.count.limt": 3})
    assert "(did you mean 'group.share.delivery.count.limit'" in str(info.value)
    with pytest.raises(UnknownNameError, match="did you mean 'record_lock_duration_ms'"):
        ShareGroupSettings.load({"record_lock_duration": 3})


def test_app_share_settings_with_an_unknown_key_is_refused() -> None:
    with pytest.raises(UnknownNameError, match="did you mean 'delivery_count_limit'"):
        queueflow.App("unknown-names", share_settings={"delivery_count_limt": 3})


def test_app_unknown_keyword_warns_with_the_queueflow_name() -> None:
    with pytest.warns(UnknownNameWarning) as caught:
        queueflow.App("unknown-names", settings={"delivery_count_limit": 3})
    (warning,) = caught
    message = str(warning.message)
    assert "unknown keyword argument 'settings' (did you mean 'share_settings'" in message
    assert "passed to faust.App" in message and "no effect" in message
    assert warning.filename == __file__  # points at the caller's line


def test_app_faust_settings_and_old_names_do_not_warn() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Faust's own FutureWarning for its old names
        warnings.simplefilter("error", UnknownNameWarning)
        queueflow.App(
            "unknown-names",
            broker="kafka://localhost:9092",
            web_port=6070,
            replication_factor=1,  # Faust's old name
            loop=None,
        )


def test_share_agent_unknown_keyword_is_refused() -> None:
    app = queueflow.App("unknown-names")
    with pytest.raises(UnknownNameError) as info:
        app.share_agent("jobs", group="g", concurency=2)  # type: ignore[call-arg]
    message = str(info.value)
    assert "App.share_agent() got an unknown keyword argument 'concurency'" in message
    assert "(did you mean 'concurrency'?)" in message
    assert isinstance(info.value, TypeError)  # as Python's own error for a bad keyword


def test_attach_and_share_consumer_unknown_keywords_are_refused() -> None:
    import faust

    with pytest.raises(
        UnknownNameError, match=r"attach\(\) .* 'setings' \(did you mean 'settings'"
    ):
        queueflow.attach(faust.App("unknown-names-attach"), setings={})  # type: ignore[call-arg]
    with pytest.raises(UnknownNameError, match="did you mean 'bootstrap_servers'"):
        queueflow.ShareConsumer("g", app_id="a", bootstrap_server="x")  # type: ignore[call-arg]


def test_every_queueflow_variable_in_the_code_is_declared() -> None:
    """A variable read by the code but not declared would be refused at start."""
    known = known_environment()
    found: set[str] = set()
    for path in (ROOT / "queueflow").rglob("*.py"):
        found |= set(re.findall(r"\bQUEUEFLOW_[A-Z][A-Z0-9_]*[A-Z0-9]\b", path.read_text()))
    assert sorted(found - known) == []


def test_every_declared_variable_is_documented() -> None:
    doc = (ROOT / "docs" / "configuration.md").read_text()
    section = doc.split("## Environment variables", 1)[1]
    missing = [v.name for v in ENVIRONMENT if f"`{v.name}`" not in section]
    assert missing == []
