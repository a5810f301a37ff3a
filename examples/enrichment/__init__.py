"""Enrichment, exactly once: a share agent enriches orders, a Faust agent keeps totals per key."""
