"""The secured local broker's configuration, certificates and ACL rows, without a JVM
(the broker itself runs in tests/integration/test_security_acls.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from queueflow.devtools.broker.acls import AclBinding
from queueflow.devtools.broker.secure import BROKER_CN, BrokerSecurity
from queueflow.errors import BrokerError


def security(tmp_path: Path) -> BrokerSecurity:
    return BrokerSecurity(
        tmp_path, 9094, 9095, {"admin": "a-pw", "alice": "b-pw"}, client_certs=["carol"]
    )


def test_broker_config_is_locked_down(tmp_path: Path) -> None:
    config = security(tmp_path).broker_config(9092, 9093)
    assert config["authorizer.class.name"].endswith("StandardAuthorizer")
    assert config["allow.everyone.if.no.acl.found"] == "false"
    assert config["super.users"] == f"User:CN={BROKER_CN};User:admin"
    assert "SASL_SSL://127.0.0.1:9094" in config["listeners"]
    assert "SSL://127.0.0.1:9095" in config["listeners"]
    assert config["listener.name.ssl.ssl.client.auth"] == "required"
    assert config["listener.name.controller.ssl.client.auth"] == "required"
    assert 'user_alice="b-pw"' in config["listener.name.sasl_ssl.plain.sasl.jaas.config"]
    assert security(tmp_path).format_args() == [
        "--add-scram",
        "SCRAM-SHA-512=[name=admin,password=a-pw]",
        "--add-scram",
        "SCRAM-SHA-512=[name=alice,password=b-pw]",
    ]


def test_certificates_load_into_client_contexts(tmp_path: Path) -> None:
    sec = security(tmp_path)
    sec.generate()
    assert (tmp_path / f"{BROKER_CN}.keystore.pem").read_text().count("BEGIN") == 2
    assert sec.ssl_context().verify_mode.name == "CERT_REQUIRED"
    sec.ssl_context("carol")  # the client certificate and key match
    kwargs = sec.sasl_kwargs("alice")
    assert kwargs["sasl_plain_password"] == "b-pw"
    assert kwargs["security_protocol"] == "SASL_SSL"


@pytest.mark.parametrize(
    ("users", "admin"), [({"admin": "x"}, "root"), ({"admin": "x y"}, "admin")]
)
def test_bad_users_are_refused(tmp_path: Path, users: dict[str, str], admin: str) -> None:
    with pytest.raises(BrokerError):
        BrokerSecurity(tmp_path, 1, 2, users, admin=admin)


def test_acl_rows() -> None:
    row = AclBinding("User:alice", "topic", "t", "write").row()
    assert row == (2, "t", 3, "User:alice", "*", 4, 3, {})
    with pytest.raises(BrokerError, match="unknown 'frobnicate'"):
        AclBinding("User:alice", "topic", "t", "frobnicate").row()
