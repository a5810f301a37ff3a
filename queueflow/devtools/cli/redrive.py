"""``queueflow share-groups --redrive``: move a group's dead-letter records back to their source
topics (:meth:`queueflow.admin.ShareGroupAdmin.redrive`; docs/guide.md "Dead-letter topics")."""

from __future__ import annotations

import json

from queueflow.admin import ShareGroupAdmin, describe_json

__all__ = ["redrive_text"]


async def redrive_text(
    admin: ShareGroupAdmin, group: str, to: str | None, dry_run: bool, as_json: bool
) -> str:
    """Run the redrive and say what moved (or would move, with ``dry_run``)."""
    result = await admin.redrive(group, to=to, dry_run=dry_run)
    if as_json:
        return json.dumps(describe_json(result))
    verb = "Would move" if dry_run else "Moved"
    lines = [
        f"{verb} {n} records from {result.dead_letter_topic!r} to {t!r}."
        for t, n in sorted(result.moved.items())
    ]
    if not result.moved:
        lines.append(f"Nothing to redrive in {result.dead_letter_topic!r}.")
    if result.skipped:
        lines.append(f"Skipped {result.skipped} records without queueflow.dead_letter.* headers.")
    if result.missing:
        lines.append(
            f"Skipped {result.missing} records without a copy whose source record is gone "
            "(retention); set errors.deadletterqueue.copy.record.enable=true to keep copies."
        )
    return "\n".join(lines)
