"""What a chaos run prints: progress on stderr, one JSON summary line on stdout."""

from __future__ import annotations

import json
import sys
from typing import Any

__all__ = ["print_summary", "say"]


def say(text: str) -> None:
    """A progress line on stderr (stdout carries only the summary)."""
    print(text, file=sys.stderr, flush=True)


def print_summary(summary: dict[str, Any]) -> None:
    """Print the summary as one JSON line on stdout (without the ``*_sample`` keys), and the
    lost records' samples on stderr if any were lost (and the records whose delivery count
    repeated, if any)."""
    print(json.dumps({k: v for k, v in summary.items() if not k.endswith("_sample")}), flush=True)
    if summary["lost"]:
        say(f"LOST {summary['lost']} records; samples: {json.dumps(summary['lost_sample'])}")
    if summary.get("repeated_delivery_counts"):
        sample = json.dumps(summary.get("repeated_sample", {}))
        say(f"REPEATED delivery counts: {summary['repeated_delivery_counts']}; samples: {sample}")
