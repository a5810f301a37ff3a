"""``queueflow acls apply``: the minimal ACLs of an app's internal topics, and a producer quota
for its member principals (docs/operations.md "Minimal ACLs" and "Junk floods, quotas and
ACLs")."""

from __future__ import annotations

import ssl
from typing import Any

import click

from queueflow.devtools.broker import bootstrap_from_env
from queueflow.devtools.broker.acls import app_acls, create_acls
from queueflow.devtools.broker.quotas import alter_user_quotas
from queueflow.devtools.cli import cli


@cli.group()
def acls() -> None:
    """ACLs and quotas of a queueflow app's topics."""


def _client_kwargs(
    bootstrap: str,
    security_protocol: str,
    sasl_mechanism: str | None,
    sasl_username: str | None,
    sasl_password: str | None,
    ssl_cafile: str | None,
) -> dict[str, Any]:
    kwargs: dict[str, Any] = {
        "bootstrap_servers": bootstrap,
        "security_protocol": security_protocol,
    }
    if security_protocol in ("SSL", "SASL_SSL"):
        kwargs["ssl_context"] = ssl.create_default_context(cafile=ssl_cafile)
    if security_protocol.startswith("SASL_"):
        if not (sasl_mechanism and sasl_username and sasl_password):
            raise click.UsageError(
                f"{security_protocol} needs --sasl-mechanism, --sasl-username and a password "
                "(--sasl-password or $QUEUEFLOW_SASL_PASSWORD)"
            )
        kwargs.update(
            sasl_mechanism=sasl_mechanism,
            sasl_plain_username=sasl_username,
            sasl_plain_password=sasl_password,
        )
    return kwargs


@acls.command("apply")
@click.option("--bootstrap-server", default=None, help="host:port [default: $QUEUEFLOW_BROKER].")
@click.option("--app", "app_id", required=True, help="The queueflow app id (the Faust app's id).")
@click.option("--topic", "topics", multiple=True, required=True, help="Source topic (repeatable).")
@click.option("--leader-principal", multiple=True, help="e.g. User:leader (repeatable).")
@click.option("--member-principal", multiple=True, help="e.g. User:member (repeatable).")
@click.option(
    "--member-producer-byte-rate",
    type=click.IntRange(1),
    default=None,
    help="Kafka's producer_byte_rate quota (bytes/s) of each member principal.",
)
@click.option(
    "--member-request-percentage",
    type=click.FloatRange(0, min_open=True),
    default=None,
    help="Kafka's request_percentage quota of each member principal.",
)
@click.option(
    "--exactly-once",
    is_flag=True,
    help="The app runs queueflow.processing.guarantee=exactly_once: add the ack topics' and "
    "the members' transactional ACLs.",
)
@click.option("--dry-run", is_flag=True, help="Print what would be applied; apply nothing.")
@click.option(
    "--security-protocol",
    default="PLAINTEXT",
    show_default=True,
    type=click.Choice(["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]),
)
@click.option("--sasl-mechanism", default=None, help="PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512.")
@click.option("--sasl-username", default=None, help="An admin allowed to alter ACLs and quotas.")
@click.option("--sasl-password", envvar="QUEUEFLOW_SASL_PASSWORD", default=None)
@click.option("--ssl-cafile", default=None, help="CA to trust [default: the system's].")
def apply(
    bootstrap_server: str | None,
    app_id: str,
    topics: tuple[str, ...],
    leader_principal: tuple[str, ...],
    member_principal: tuple[str, ...],
    member_producer_byte_rate: int | None,
    member_request_percentage: float | None,
    exactly_once: bool,
    dry_run: bool,
    security_protocol: str,
    sasl_mechanism: str | None,
    sasl_username: str | None,
    sasl_password: str | None,
    ssl_cafile: str | None,
) -> None:
    """Create the minimal ALLOW ACLs of app APP on TOPICs for its leader and member principals
    (so that, with allow.everyone.if.no.acl.found=false, no other principal may write its
    internal topics) and set the member principals' producer quotas."""
    if not leader_principal and not member_principal:
        raise click.UsageError("give --leader-principal and/or --member-principal")
    bindings = app_acls(app_id, topics, leader_principal, member_principal, exactly_once)
    quotas: dict[str, float] = {}
    if member_producer_byte_rate is not None:
        quotas["producer_byte_rate"] = member_producer_byte_rate
    if member_request_percentage is not None:
        quotas["request_percentage"] = member_request_percentage
    for b in bindings:
        click.echo(f"ALLOW {b.principal} {b.operation.upper()} {b.resource_type} {b.resource_name}")
    for principal in member_principal if quotas else ():
        click.echo(f"QUOTA {principal} " + " ".join(f"{k}={v:g}" for k, v in quotas.items()))
    if dry_run:
        return
    bootstrap = bootstrap_server or bootstrap_from_env() or "localhost:9092"
    kwargs = _client_kwargs(
        bootstrap, security_protocol, sasl_mechanism, sasl_username, sasl_password, ssl_cafile
    )
    create_acls(kwargs, bindings)
    for principal in member_principal if quotas else ():
        alter_user_quotas(kwargs, principal, quotas)
    click.echo(
        f"applied {len(bindings)} ACLs"
        + (f" and quotas of {len(member_principal)} member principal(s)" if quotas else "")
    )
