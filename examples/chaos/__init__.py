"""``make chaos``: share groups under SIGKILLs and a broker restart, checked against a ledger.

See :mod:`examples.chaos.__main__` for the driver and :mod:`examples.chaos.app` for the workers.
"""
