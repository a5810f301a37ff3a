"""queueflow.logging.JunkDrops: every dropped record counted, at most ``burst`` lines a period."""

from __future__ import annotations

from typing import Any

from queueflow.logging import JunkDrops
from queueflow.metrics import Metrics


class Log:
    def __init__(self) -> None:
        self.lines: list[tuple[str, dict[str, Any]]] = []

    def warning(self, event: str, **fields: Any) -> None:
        self.lines.append((event, fields))


def test_a_flood_is_counted_in_full_and_logged_at_most_burst_lines_per_period() -> None:
    now = [0]
    log, metrics = Log(), Metrics()
    drops = JunkDrops(
        log, "control_message_dropped", lambda: now[0], metrics.control_messages_dropped, "leader"
    )
    for _ in range(10_000):
        drops.drop("unknown_format", partition=0)
    drops.drop("too_short", partition=1)
    assert drops.total == 10_001
    assert len(log.lines) == 20
    assert all(f["suppressed"] == 0 for _e, f in log.lines)
    now[0] = 10_000  # next period: the first line says how many were not logged
    drops.drop("empty", partition=0)
    assert log.lines[-1] == (
        "control_message_dropped",
        {"reason": "empty", "suppressed": 9_981, "partition": 0},
    )

    def value(reason: str) -> float | None:
        return metrics.registry.get_sample_value(
            "queueflow_control_messages_dropped_total",
            {"receiver": "leader", "reason": reason},
        )

    assert value("unknown_format") == 10_000
    assert value("too_short") == 1
    assert value("empty") == 1


def test_without_a_counter_only_the_log_is_limited() -> None:
    log = Log()
    drops = JunkDrops(log, "undecodable_reply", lambda: 0, burst=2)
    for _ in range(5):
        drops.drop("bad_seal")
    assert drops.total == 5 and len(log.lines) == 2


def test_a_junk_gate_keeps_the_messages_of_a_batch_in_order_and_counts_the_rest() -> None:
    from dataclasses import dataclass
    from types import SimpleNamespace

    from queueflow.protocol.credentials import Credentials
    from queueflow.protocol.roles import ControlAuth
    from queueflow.server.junk import JunkGate

    @dataclass
    class Rec:
        value: bytes | None

    ctx: Any = SimpleNamespace(metrics=Metrics(), clock=SimpleNamespace(monotonic=lambda: 0.0))
    auth = ControlAuth(Credentials.from_secret("jG5-junk-gate-secret-8Kq_Wm3Zb6Nr2Vt9Lc4Hy", "app"))
    log = Log()
    gate = JunkGate(ctx, auth, "leader", "app-share-fetch-t", log)
    good = [Rec(auth.seal(b'{"kind":"tick"}', "app-share-fetch-t/0")) for _ in range(3)]
    batch = [Rec(b"junk")] * 5000 + [good[0], Rec(None), good[1], Rec(b"\xa2x"), good[2]]
    batch.append(Rec(b"\xa1" + bytes(100)))
    assert gate.keep(0, batch) == good
    assert gate.drops.total == 5003
    assert [f["reason"] for _e, f in log.lines] == [
        "unknown_format",
        "empty",
        "too_short",
        "envelope_v1",
    ]
    assert log.lines[0][1]["records"] == 5000
