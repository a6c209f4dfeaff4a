"""Version negotiation: clients only use API versions the gateway can read.

The ApiVersions response is narrowed (the approach Kroxylicious takes): for every
API key the codec knows, the advertised range is clipped to the codec's range;
keys the codec does not know pass through untouched, so a newer broker's extra
APIs are never fatal.

Some versions are clipped further:
- Produce v10+ and Fetch v16+ add `NodeEndpoints` (KIP-951 leader hints) as a tagged
  field at the end of the body, after all records, and share-group fetches carry
  them too: broker addresses in places a pass-through frame cannot be rewritten
  cheaply. Holding every Produce/Fetch response to rewrite a field present only
  after a leader change would cost the data path its pass-through speed.
- Fetch v13+ names topics by id (KIP-516) instead of by name; topic rules must see
  names, so clients stay on v12, which every Kafka 2.7+ broker serves.
"""

from __future__ import annotations

from typing import Any

import kafka_wire
from ext_proc.connection import ConnectionInfo
from kafka_wire.api_keys import API_VERSIONS, FETCH, PRODUCE

# API key -> highest version the gateway lets clients use (reasons above).
CLIENT_MAX_VERSION = {PRODUCE: 9, FETCH: 12}
SHARE_FETCH, SHARE_ACKNOWLEDGE = 78, 79
HIDDEN_API_KEYS = frozenset({SHARE_FETCH, SHARE_ACKNOWLEDGE})


class ApiVersionsNarrower:
    api_keys = frozenset({API_VERSIONS})

    def wants(self, api_key: int, api_version: int) -> bool:
        return api_key == API_VERSIONS

    def filter_response(
        self, api_key: int, api_version: int, body: dict[str, Any], conn: ConnectionInfo
    ) -> bool:
        entries = body.get("ApiKeys") or []
        before = [(e["ApiKey"], e["MinVersion"], e["MaxVersion"]) for e in entries]
        kept: list[dict[str, Any]] = []
        for entry in entries:
            key = entry["ApiKey"]
            if key in HIDDEN_API_KEYS:
                continue
            known = kafka_wire.supported_versions(key)
            if known is not None:
                low = max(entry["MinVersion"], known[0])
                safe = CLIENT_MAX_VERSION.get(key, known[1])
                high = min(entry["MaxVersion"], known[1], safe)
                if low > high:
                    continue
                entry["MinVersion"], entry["MaxVersion"] = low, high
            kept.append(entry)
        body["ApiKeys"] = kept
        return before != [(e["ApiKey"], e["MinVersion"], e["MaxVersion"]) for e in kept]
