"""Defaults the ext_proc service shares with the CLI and the control plane, kept apart from
the modules that do the work so that `keg --help` imports nothing heavy."""

from typing import Final

# How often a watched rule directory is looked at; a change is read once the directory held
# still for one interval, so it is in force one to two intervals after it was written.
DEFAULT_POLL_INTERVAL_S: Final = 1.0
# Below this, polling a large directory (a stat of every file) becomes the busiest thing
# the process does.
MIN_POLL_INTERVAL_S: Final = 0.1
