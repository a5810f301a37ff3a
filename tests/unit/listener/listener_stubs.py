"""Shared pieces of the listener unit tests."""

from __future__ import annotations

from queueflow.server.connections import DirectLimits


def unit_limits(unauthenticated_max_frame_bytes: int = 4096) -> DirectLimits:
    """The listener limits the unit tests use: 4 KiB frames, nothing timing out in a test."""
    return DirectLimits(
        unauthenticated_max_frame_bytes=unauthenticated_max_frame_bytes,
        max_frame_bytes=4096,
        unauthenticated_idle_s=600.0,
        idle_s=600.0,
        frame_read_timeout_s=10.0,
        write_timeout_s=10.0,
    )
