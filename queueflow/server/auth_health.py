"""Does this worker's key match its peers'? A monitor of the control messages it receives.

A worker started with another ``queueflow.auth.secret`` than the rest of the app refuses every
member request and every peer message as wrongly signed, yet keeps its Faust partitions: it
serves nothing and members only see "no answer" (docs/operations.md "Threat model and attack
matrix"). :class:`AuthHealth` is fed, by each place that opens a control message (leaders,
coordinator, direct endpoint), with how the opening went, and decides when the evidence says
*this worker's* key differs from its peers': then the host logs ``auth_key_mismatch`` and stops
the worker with a non-zero exit, so that Faust gives its partitions to the other workers.

The rule, within a sliding window of ``window_ms``:

* at least ``threshold`` messages from other processes were refused for their signature
  (``bad_signature``, or ``wrong_key`` when the envelope names the key it was signed with);
* each of them was *well-formed*: a signed envelope whose (unverified) header decodes and
  names a sender (:func:`claimed_sender`), i.e. shaped as peers' messages are. Junk (unsigned,
  malformed, random bytes) never counts;
* **no** message from another process verified, ever since this worker started: one
  verified message proves the key right (keys don't change while a process runs), so the
  monitor disarms for good;
* and another worker holds some of the app's control partitions (``has_peers``): a worker
  alone would give its partitions to nobody, so it never stops for this.

"Another process" is a sender that is neither one of this process's server loops
(``<app_id>/<role>``: every worker signs as those, so they prove nothing) nor one of its own
members (``is_local``). Members' requests are what a worker hears most; a worker with the
wrong key hears them all refused within seconds.

Trade-off: an attacker who can write the internal topics (see docs/operations.md for the ACLs
that prevent it) can forge well-formed envelopes with a bad MAC. That stops only a worker that
has peers and has not verified a single message from another process since it started (an app
whose members have not reached it yet); a worker in a working app, or alone, is immune. The
stopped worker's supervisor restarts it.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable

from queueflow.protocol.envelope import claimed_sender

__all__ = [
    "AUTH_HEALTH_THRESHOLD",
    "AUTH_HEALTH_WINDOW_MS",
    "KEY_REFUSALS",
    "AuthHealth",
    "claimed_sender",
]

#: Refusals (for the signature, of well-formed messages from other processes) that, within
#: :data:`AUTH_HEALTH_WINDOW_MS` and with none verified, make the monitor fire.
AUTH_HEALTH_THRESHOLD = 5
#: The sliding window of :data:`AUTH_HEALTH_THRESHOLD`, in ms: long, because a member retries
#: a request no leader answered only after ``queueflow.request.timeout.ms`` (10 s), and a
#: joining member backs off further: one member alone makes a wrongly keyed worker refuse
#: one message per 10 to 20 s.
AUTH_HEALTH_WINDOW_MS = 120_000
#: ``AuthenticationError.reason`` values that say "signed with another key" (``wrong_key``:
#: the envelope names a key id that is not ours; ``bad_signature``: the MAC doesn't match).
KEY_REFUSALS = frozenset({"bad_signature", "wrong_key"})


class AuthHealth:
    """The monitor (see the module docstring). Pure: fed per message, returns its verdict; the
    host acts on it (``on_mismatch``).

    Args:
        server_prefix: ``"<app_id>/"``: senders starting with it are server loops (any worker's,
            this one's included), which prove nothing either way.
        is_local: whether a sender is one of this process's own members.
        has_peers: whether another worker of the app holds some of its control partitions.
        window_ms / threshold: the rule's window (ms) and count.
        clock: monotonic ms.
        on_mismatch: called once, with a description of the evidence, when the rule fires.
    """

    def __init__(
        self,
        server_prefix: str | None = None,
        *,
        is_local: Callable[[str], bool] = lambda sender: False,
        has_peers: Callable[[], bool] = lambda: True,
        window_ms: int = AUTH_HEALTH_WINDOW_MS,
        threshold: int = AUTH_HEALTH_THRESHOLD,
        clock: Callable[[], int] | None = None,
        on_mismatch: Callable[[str], None] | None = None,
    ) -> None:
        self.server_prefix = server_prefix
        self.is_local = is_local
        self.has_peers = has_peers
        self.window_ms = window_ms
        self.threshold = threshold
        self._clock = clock
        self.on_mismatch = on_mismatch
        #: A message from another process verified: the key is right (never fires again).
        self.proven = False
        #: The rule fired (once).
        self.fired = False
        self._refused: collections.deque[int] = collections.deque()

    def _from_other(self, sender: str) -> bool:
        prefix = self.server_prefix
        if prefix is not None and sender.startswith(prefix):
            return False
        return not self.is_local(sender)

    def verified(self, sender: str) -> None:
        """A message signed by ``sender`` verified."""
        if not self.proven and self._from_other(sender):
            self.proven = True
            self._refused.clear()

    def refused(self, raw: bytes | bytearray | memoryview, reason: str) -> bool:
        """A message (``raw``, its bytes as received) was refused for ``reason`` (the
        ``AuthenticationError.reason``). Returns True when this refusal makes the rule fire
        (once; ``on_mismatch`` is called then)."""
        if self.proven or self.fired or reason not in KEY_REFUSALS:
            return False
        sender = claimed_sender(raw)
        if sender is None or not self._from_other(sender):
            return False
        return self.count_refusal(reason, sender)

    def count_refusal(self, reason: str, sender: str, now_ms: int | None = None) -> bool:
        """Count one well-formed refusal (``refused`` after its checks); True when it fires."""
        if self.proven or self.fired:
            return False
        now = now_ms if now_ms is not None else (self._clock() if self._clock else _now_ms())
        refused = self._refused
        refused.append(now)
        while refused and now - refused[0] > self.window_ms:
            refused.popleft()
        if len(refused) < self.threshold or not self.has_peers():
            return False
        self.fired = True
        if self.on_mismatch is not None:
            self.on_mismatch(
                f"{len(refused)} signed messages from other processes (the last from "
                f"{sender!r}, {reason}) were refused within {self.window_ms} ms, and none "
                "verified since this worker started"
            )
        return True


def _now_ms() -> int:
    return int(time.monotonic() * 1000)
