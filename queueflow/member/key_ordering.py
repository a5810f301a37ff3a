"""A member's side of key-ordered sharing (``ordering="key"`` on ``@app.share_agent`` and
``ShareConsumer``; docs/concepts.md "Key-ordered sharing").

Key ordering is a group config, ``share.ordering=key``, that the coordinator owns and the
leaders enforce: a member can't switch it on for its group (it has no admin rights). A share
agent declared with ``ordering="key"`` makes it the app's default for its group
(``App(group_configs=...)``), which the app's coordinator uses; a ``ShareConsumer`` with
``ordering="key"`` (and such an agent, in case the group's coordinator runs another app) checks
after joining that its assignment ticket says ``share.ordering=key``, and refuses to consume
otherwise: handing its records out unordered would break what the handler relies on.
"""

from __future__ import annotations

from queueflow.errors import ConfigurationError
from queueflow.protocol.auth import ticket_configs

__all__ = ["ORDERINGS", "check_key_ordered", "check_ordering"]

#: The values of ``ordering=``.
ORDERINGS = ("none", "key")


def check_ordering(ordering: str) -> str:
    """``ordering`` checked: ``none`` or ``key``.

    Raises:
        ConfigurationError: anything else.
    """
    if ordering not in ORDERINGS:
        raise ConfigurationError(f"ordering={ordering!r} is not allowed: use 'none' or 'key'")
    return ordering


def check_key_ordered(group: str, ticket: bytes) -> None:
    """Refuse to consume a group that is not key-ordered (its ticket's ``share.ordering``).

    Raises:
        ConfigurationError: the group's ``share.ordering`` is not ``key``; the message says
            how to set it.
    """
    if ticket_configs(ticket).get("share.ordering") != "key":
        raise ConfigurationError(
            f"share group {group!r} is not key-ordered (share.ordering is not 'key'), but this "
            "member asks for ordering='key': set it for the group with 'queueflow configs "
            f"--group {group} --alter --add-config share.ordering=key' (or "
            "App(group_configs={...}) / @app.share_agent(..., ordering='key') in the app that "
            "runs the group's coordinator), then join again"
        )
