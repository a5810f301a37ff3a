"""A work queue on a share group: retries with back-off, RELEASE, and a dead-letter topic."""
