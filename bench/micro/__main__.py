"""``python -m bench.micro``: run the micro-benchmarks (see :mod:`bench.micro.suite`)."""

import sys

from bench.micro.suite import main

sys.exit(main())
