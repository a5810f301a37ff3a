"""``make chaos``: share groups under SIGKILLs and a broker restart, checked against a ledger.

See :mod:`examples.chaos.__main__` for the rules and the command line, :mod:`examples.chaos.run`
for the orchestration and :mod:`examples.chaos.app` for the workers.
"""
