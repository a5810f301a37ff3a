"""``queueflow auth``: the keys of ``queueflow.auth.mode=hmac``.

``queueflow auth member-credential --app-id APP`` prints the member credential of an app (read
the worker secret from ``$QUEUEFLOW_AUTH_SECRET``): give it to member processes as
``queueflow.auth.member.credential`` instead of the secret (docs/operations.md "Threat model and
attack matrix").
"""

from __future__ import annotations

import os

import click

from queueflow.devtools.cli import cli
from queueflow.errors import ConfigurationError
from queueflow.protocol.credentials import Credentials, member_credential


@cli.group()
def auth() -> None:
    """Keys of queueflow.auth.mode=hmac (worker secret, member credentials)."""


@auth.command("member-credential")
@click.option("--app-id", required=True, help="The Faust app id the credential is for.")
def member_credential_command(app_id: str) -> None:
    """Print the member credential of APP-ID, made from $QUEUEFLOW_AUTH_SECRET.

    A member credential lets a member (ShareConsumer, share agent) join, fetch and acknowledge
    without the worker secret; it can't sign fences, tickets, configs, leader announcements or
    admin requests. Set it as QUEUEFLOW_AUTH_MEMBER_CREDENTIAL on members. Its key id (also
    printed, on stderr) is what workers log when they refuse a message signed with another key.
    """
    secret = os.environ.get("QUEUEFLOW_AUTH_SECRET", "")
    if not secret:
        raise click.ClickException(
            "set QUEUEFLOW_AUTH_SECRET to the app's worker secret (the credential is derived "
            "from it)"
        )
    try:
        credential = member_credential(secret, app_id)
    except ConfigurationError as exc:
        raise click.ClickException(str(exc)) from None
    key_id = Credentials.from_secret(secret, app_id).member_key_id.hex()
    click.echo(credential)
    click.echo(f"member key id {key_id} (app {app_id!r})", err=True)
