"""Which key each member speaks with: the coordinator's binding of member ids to member keys.

Under ``queueflow.auth.mode=hmac`` a member's heartbeat travels in a member envelope encrypted
with its ephemeral X25519 key, and names the same key as its reply key (checked by
:meth:`~queueflow.protocol.roles.ControlAuth.check_sender`). The first heartbeat of a member id
binds the id to that key; a later heartbeat for the same id from another key is refused: another
holder of a member credential taking over a member (its tickets would then bind the victim's id
to the attacker's key). Leaving (member epoch -1) unbinds. Kept in memory (a new coordinator
binds again on the next heartbeat) and bounded. Pure: no I/O.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Final

__all__ = ["MemberKeys"]

#: Bindings kept at most; past it the least recently used is forgotten.
_MAX_MEMBERS: Final = 100_000


class MemberKeys:
    """(group, member id) → the member's key, first heartbeat wins.

    Args:
        max_members: bindings kept at most (least recently used out).
    """

    def __init__(self, max_members: int = _MAX_MEMBERS) -> None:
        self._keys: OrderedDict[tuple[str, str], bytes] = OrderedDict()
        self._max = max_members

    def bind(self, group: str, member_id: str, key: bytes, *, leaving: bool = False) -> bool:
        """Bind ``member_id`` of ``group`` to ``key`` (or check it is bound to it); ``False``:
        the id is bound to another key (refuse the heartbeat). ``leaving``: unbind after."""
        slot = (group, member_id)
        bound = self._keys.get(slot)
        if bound is not None and bound != key:
            return False
        if leaving:
            self._keys.pop(slot, None)
            return True
        self._keys[slot] = key
        self._keys.move_to_end(slot)
        if len(self._keys) > self._max:
            self._keys.popitem(last=False)
        return True

    def __len__(self) -> int:
        return len(self._keys)
