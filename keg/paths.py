"""Where keg's non-Python files live: the repository root (keg is installed editable)."""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
