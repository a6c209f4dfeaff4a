"""Where keg's non-Python files live: the repository root (keg is installed editable)."""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent

# The SASL password of the producer `copy` rules use, handed from `keg up` to the
# ext_proc child in its environment (never on a command line, where `ps` shows it).
SIDE_EFFECTS_PASSWORD_ENV = "KEG_SIDE_EFFECTS_SASL_PASSWORD"

# The SASL password of the audit stream's producer (`--audit-kafka-config`), likewise.
AUDIT_KAFKA_PASSWORD_ENV = "KEG_AUDIT_KAFKA_SASL_PASSWORD"
