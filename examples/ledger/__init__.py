"""A per-account ledger with key-ordered sharing (python -m examples.ledger)."""
