"""``python -m queueflow`` runs the ``queueflow`` command line."""

from queueflow.devtools.cli import main

main()
