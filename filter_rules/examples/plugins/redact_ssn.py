"""An example custom interceptor (KIP-905 contract), loaded by custom-interceptor.yaml.

    configure(config)  once, when the rule set is compiled; raise to refuse the set
    intercept(record)  per record: return it (changed in place or a new one), return
                       None to drop it, raise interceptors.RecordRejected(reason) to
                       refuse its batch with INVALID_RECORD; any other exception
                       answers the partition with UNKNOWN_SERVER_ERROR

`record` has topic, partition, key, value (bytes or None), headers (a list of
(name, bytes-or-None) pairs), timestamp (ms), offset (consume time), principal and
direction ("produce" or "consume"). Keep `intercept` fast and free of blocking I/O:
it runs under the rule's `timeout_ms` budget per batch, with `retries`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from interceptors import InterceptedRecord, RecordRejected

# A fixed pattern of the plugin's own; users' patterns in rule files are RE2.
_SSN = re.compile(rb"\b\d{3}-\d{2}-\d{4}\b")


class RedactSsn:
    def configure(self, config: Mapping[str, Any]) -> None:
        self.replacement = str(config.get("replacement", "***-**-****")).encode()
        self.reject_marker = str(config.get("reject_marker", "")).encode()

    def intercept(self, record: InterceptedRecord) -> InterceptedRecord | None:
        if record.value is None:
            return record
        if self.reject_marker and self.reject_marker in record.value:
            raise RecordRejected(f"value contains {self.reject_marker.decode()!r}")
        redacted, count = _SSN.subn(self.replacement, record.value)
        if count:
            record.value = redacted
            record.headers.append(("keg.redacted", str(count).encode()))
        return record
