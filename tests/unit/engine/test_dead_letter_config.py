"""The KIP-1191 group configs ``errors.deadletterqueue.topic.name`` and
``errors.deadletterqueue.copy.record.enable``: validation, defaults, description, tickets."""

from __future__ import annotations

import pytest

from queueflow.engine.group_config import (
    DEAD_LETTER_COPY_RECORD,
    DEAD_LETTER_TOPIC,
    GROUP_CONFIG_NAMES,
    LEADER_CONFIG_NAMES,
    GroupConfig,
    describe_group_configs,
    validate_group_config,
)
from queueflow.errors import ConfigurationError
from queueflow.settings import ShareGroupSettings

SETTINGS = ShareGroupSettings()


def test_names_are_group_and_leader_configs() -> None:
    for name in (DEAD_LETTER_TOPIC, DEAD_LETTER_COPY_RECORD):
        assert name in GROUP_CONFIG_NAMES
        assert name in LEADER_CONFIG_NAMES


def test_defaults_are_no_dlq_and_no_copy() -> None:
    config = GroupConfig.resolve(SETTINGS)
    assert config.dead_letter_topic == ""
    assert config.dead_letter_copy_record is False
    assert config.value_of(DEAD_LETTER_COPY_RECORD) == "false"
    entries = {e.name: e for e in describe_group_configs(SETTINGS, {}, {})}
    assert entries[DEAD_LETTER_TOPIC].value == ""
    assert entries[DEAD_LETTER_TOPIC].source == "DEFAULT_CONFIG"
    assert entries[DEAD_LETTER_COPY_RECORD].value == "false"


def test_values_resolve() -> None:
    config = GroupConfig.resolve(
        SETTINGS, {DEAD_LETTER_TOPIC: "orders.dlq", DEAD_LETTER_COPY_RECORD: "true"}
    )
    assert config.dead_letter_topic == "orders.dlq"
    assert config.dead_letter_copy_record is True


@pytest.mark.parametrize(
    ("value", "normal"), [("orders-dlq", "orders-dlq"), (" a.b_c ", "a.b_c"), ("", "")]
)
def test_legal_topic_names(value: str, normal: str) -> None:
    assert validate_group_config(DEAD_LETTER_TOPIC, value, SETTINGS) == normal


@pytest.mark.parametrize("value", ["a b", "x" * 250, "..", "ö", 3])
def test_illegal_topic_names_are_refused_naming_the_config(value: object) -> None:
    with pytest.raises(ConfigurationError, match=DEAD_LETTER_TOPIC):
        validate_group_config(DEAD_LETTER_TOPIC, value, SETTINGS)


@pytest.mark.parametrize(("value", "normal"), [("TRUE", "true"), (False, "false")])
def test_copy_record_booleans(value: object, normal: str) -> None:
    assert validate_group_config(DEAD_LETTER_COPY_RECORD, value, SETTINGS) == normal


def test_copy_record_refuses_other_values() -> None:
    with pytest.raises(ConfigurationError, match="use true or false"):
        validate_group_config(DEAD_LETTER_COPY_RECORD, "yes", SETTINGS)
