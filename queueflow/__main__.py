"""``python -m queueflow`` runs the ``queueflow`` command line."""

from queueflow.cli import cli

cli()
