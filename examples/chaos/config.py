"""The parameters of a chaos run and the outcomes its ledger records."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["DEFAULT_SHARE_SETTINGS", "FAILED", "ROOT", "TERMINAL", "ChaosConfig"]

#: The repository root (workers run there, so ``examples.chaos.app`` imports).
ROOT = Path(__file__).resolve().parents[2]
#: Ledger outcomes that end a record.
TERMINAL = ("ACCEPT", "REJECT")
#: Ledger outcomes of a failed delivery (redelivered, or Archived at the delivery limit).
FAILED = ("RELEASE", "RAISE")

#: Share-group settings for a quick recovery (KIP-932 names; every worker gets the same).
DEFAULT_SHARE_SETTINGS: dict[str, int | str] = {
    "share.auto.offset.reset": "earliest",
    "group.share.record.lock.duration.ms": 5000,
    "group.share.session.timeout.ms": 10000,
    "group.share.heartbeat.interval.ms": 1000,
    "group.share.delivery.count.limit": 5,
}


@dataclass
class ChaosConfig:
    """Parameters of one chaos run (defaults: the full ``make chaos`` run)."""

    records: int = 50_000
    partitions: int = 3
    roles: tuple[str, ...] = ("all", "all", "member", "member", "member", "member")
    #: seconds between two SIGKILLs (0: no kills)
    kill_interval_s: float = 3.0
    #: at most this many kills (None: no limit)
    max_kills: int | None = None
    #: stop killing after this many seconds of the run (None: until every record is done)
    kill_for_s: float | None = None
    #: roles that may be killed
    kill_roles: tuple[str, ...] = ("all", "leader", "member")
    #: kill exactly these roles, in this order (a random worker of each), instead of
    #: ``max_kills`` random ones
    kill_sequence: tuple[str, ...] | None = None
    #: with ``kill_sequence``: kill number k once this fraction of the records is done, instead
    #: of every ``kill_interval_s`` (a schedule that does not depend on the machine's speed)
    kill_at: tuple[float, ...] | None = None
    #: restart the broker once (only if this run can: a LocalBroker is given)
    broker_restart: bool = True
    #: seconds the broker stays down
    broker_down_s: float = 10.0
    #: restart the broker once this fraction of the records has a terminal outcome
    broker_restart_at: float = 0.5
    #: brokers of the run's local cluster (``--brokers``; 1: one combined KRaft node, restarted
    #: once; 3: ``make chaos-cluster``, :mod:`examples.chaos.cluster`)
    brokers: int = 1
    #: with a cluster: SIGKILL one broker for good once this fraction of the records is done
    broker_kill_at: float = 0.1
    #: with a cluster: roll-restart the other brokers once this fraction is done
    broker_roll_at: float = 0.2
    #: overall bound (s) for the workers to finish every record
    timeout_s: float = 600.0
    seed: int = 0
    concurrency: int = 8
    #: mean simulated handler work (ms)
    work_ms: float = 1.0
    release_p: float = 0.05
    reject_p: float = 0.01
    poison_mod: int = 997
    share_settings: dict[str, int | str] = field(
        default_factory=lambda: dict(DEFAULT_SHARE_SETTINGS)
    )
    #: read the request and reply topics at the end: requests answered more than once
    diagnose: bool = True
    #: seconds without ledger progress after which open ids are checked against leader state
    stall_check_s: float = 15.0
    log_level: str = "info"
    #: the share agent publishes one result per ACCEPTed record with
    #: ``processing_guarantee="exactly_once"``; the run counts them downstream
    #: (:mod:`examples.chaos.results`)
    exactly_once: bool = False
    #: give the group a dead-letter topic (``<topic>-dlq``) and check that every archived
    #: record is in it (:mod:`examples.chaos.dead_letters`)
    dead_letters: bool = True

    @property
    def replication_factor(self) -> int:
        """Of the run's topics (source, DLQ, results) and of queueflow's and Faust's."""
        return min(self.brokers, 3)

    @property
    def delivery_limit(self) -> int:
        return int(self.share_settings.get("group.share.delivery.count.limit", 5))

    @property
    def lock_s(self) -> float:
        return int(self.share_settings.get("group.share.record.lock.duration.ms", 30000)) / 1000
