"""The settings, internal names, table keys and ACLs of ``queueflow.processing.guarantee``
(docs/architecture.md "Exactly-once: transactional acknowledgements")."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from queueflow.devtools.broker.acls import AclBinding, app_acls, role_acls
from queueflow.devtools.cli import cli
from queueflow.engine.group_config import GroupConfig
from queueflow.errors import ConfigurationError
from queueflow.protocol import topics
from queueflow.protocol.state_codec import (
    ack_position_key,
    parse_state_key,
    request_position_key,
)
from queueflow.server.group_configs import engine_config
from queueflow.settings import ProcessingGuarantee, ShareGroupSettings


def test_the_guarantee_defaults_to_at_least_once_and_a_misspelt_one_names_the_allowed() -> None:
    assert ShareGroupSettings().processing_guarantee is ProcessingGuarantee.AT_LEAST_ONCE
    loaded = ShareGroupSettings.load(env={"QUEUEFLOW_PROCESSING_GUARANTEE": "exactly_once"})
    assert loaded.processing_guarantee is ProcessingGuarantee.EXACTLY_ONCE
    with pytest.raises(ConfigurationError, match="at_least_once \\| exactly_once"):
        ShareGroupSettings.load({"queueflow.processing.guarantee": "exactly-once"})


@pytest.mark.parametrize("value", [999, 900_001])
def test_the_transaction_timeout_is_bounded_by_the_brokers_maximum(value: int) -> None:
    assert ShareGroupSettings().transaction_timeout_ms == 10_000
    with pytest.raises(ConfigurationError, match=r"queueflow\.transaction\.timeout\.ms"):
        ShareGroupSettings.load({"queueflow.transaction.timeout.ms": value})


def test_only_an_exactly_once_app_ends_locks_instead_of_releasing_by_member() -> None:
    for guarantee, deferred in (("at_least_once", False), ("exactly_once", True)):
        settings = ShareGroupSettings(processing_guarantee=guarantee)
        config = engine_config(settings, GroupConfig.resolve(settings))
        assert config.release_by_lock_end is deferred


def test_the_ack_topic_and_its_position_key() -> None:
    assert topics.ack_topic("A", "jobs") == "A-share-ack-jobs"
    assert ack_position_key(3) == b"A/3" != request_position_key(3)
    assert parse_state_key(b"A/3") == ("A", "", 3, None)
    assert parse_state_key(b"R/3") == ("R", "", 3, None)


def test_exactly_once_acls_add_the_ack_topic_and_the_members_transactions() -> None:
    leader = set(role_acls("leader", "User:l", "A", ["T"], exactly_once=True))
    member = set(role_acls("member", "User:m", "A", ["T"], exactly_once=True))
    assert {b.operation for b in leader if b.resource_name == "A-share-ack-T"} == {
        "create",
        "read",
    }
    assert not any(b.resource_type == "transactional_id" for b in leader)
    assert AclBinding("User:m", "topic", "A-share-ack-T", "write") in member
    for op in ("write", "describe"):
        assert AclBinding("User:m", "transactional_id", "A-share-txn-", op, "prefixed") in member
    assert AclBinding("User:m", "cluster", "kafka-cluster", "idempotent_write") in member
    plain = app_acls("A", ["T"], ["User:l"], ["User:m"])
    assert not any("share-ack" in b.resource_name or b.pattern == "prefixed" for b in plain)


def test_acls_apply_exactly_once_prints_the_ack_topic_and_transaction_acls() -> None:
    argv = ["acls", "apply", "--app", "A", "--topic", "T", "--member-principal", "User:m"]
    plain = CliRunner().invoke(cli, [*argv, "--dry-run"])
    eos = CliRunner().invoke(cli, [*argv, "--exactly-once", "--dry-run"])
    assert plain.exit_code == 0 and eos.exit_code == 0, eos.output
    assert "share-ack" not in plain.output
    assert "ALLOW User:m WRITE topic A-share-ack-T" in eos.output
    assert "ALLOW User:m WRITE transactional_id A-share-txn-" in eos.output
