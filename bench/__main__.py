"""``python -m bench``: run the benchmark suite (see :mod:`bench.suite`)."""

import sys

from bench.suite import main

sys.exit(main())
