"""Defaults the control plane shares with the CLI, kept apart from the modules that do the
work so that `keg --help` imports nothing heavy."""

from typing import Final

# How often the brokers are asked which brokers there are. A broker added (or back on
# another address) is sent to the listener of the client's own broker until then, and
# its clients retry: 17 s of retries measured with 30 s. One Metadata request each time.
DEFAULT_REFRESH_INTERVAL_S: Final = 10.0
# Below this, refreshes become a flood of connections to the brokers (0 made ~1,000 a
# second): the CLI refuses less.
MIN_REFRESH_INTERVAL_S: Final = 1.0

# In the control plane's state directory: the order brokers were first seen in, which
# their listener ports follow (ControlPlaneSettings.broker_order_file).
BROKER_ORDER_FILE: Final = "broker-order.json"
