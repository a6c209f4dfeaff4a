"""keg's benchmarks: the gateway against direct broker access (``python -m benchmarks``)."""
