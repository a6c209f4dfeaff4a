"""``python -m benchmarks``: gateway vs direct, side by side (see ``--help``)."""

import sys

from benchmarks.gateway_vs_direct import main

sys.exit(main())
