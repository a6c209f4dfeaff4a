"""kafka_wire: the sans-IO Kafka protocol core (framing, correlation, message codec)."""

from kafka_wire.codec import (
    UNKNOWN_TAGS,
    Buffer,
    RequestHeader,
    api_name,
    decode_body,
    decode_request,
    decode_response,
    decode_struct,
    encode_body,
    encode_request,
    encode_response,
    encode_struct,
    known_api_keys,
    read_request_header,
    read_response_header,
    request_header_version,
    response_header_version,
    supported_versions,
    write_request_header,
    write_response_header,
)
from kafka_wire.enums import ApiKey, ErrorCode
from kafka_wire.errors import DecodeError, EncodeError, KafkaWireError, UnknownApiError

__all__ = [
    "UNKNOWN_TAGS",
    "ApiKey",
    "Buffer",
    "DecodeError",
    "EncodeError",
    "ErrorCode",
    "KafkaWireError",
    "RequestHeader",
    "UnknownApiError",
    "api_name",
    "decode_body",
    "decode_request",
    "decode_response",
    "decode_struct",
    "encode_body",
    "encode_request",
    "encode_response",
    "encode_struct",
    "known_api_keys",
    "read_request_header",
    "read_response_header",
    "request_header_version",
    "response_header_version",
    "supported_versions",
    "write_request_header",
    "write_response_header",
]

# KIP-559 group payloads (JoinGroup/SyncGroup metadata and assignments) and KIP-590
# envelopes: modules of their own, re-exported here.
from kafka_wire.envelope import (
    ForwardedRequest,
    ForwardedResponse,
    Principal,
    decode_envelope_request,
    decode_envelope_response,
    decode_principal,
    read_envelope_request,
    read_envelope_response,
)
from kafka_wire.group_protocol import (
    DecodedGroupPayload,
    GroupObservation,
    GroupPayload,
    GroupProtocolTracker,
    Inconsistency,
    decode_assignment,
    decode_subscription,
    encode_payload,
)

__all__ += [
    "DecodedGroupPayload",
    "ForwardedRequest",
    "ForwardedResponse",
    "GroupObservation",
    "GroupPayload",
    "GroupProtocolTracker",
    "Inconsistency",
    "Principal",
    "decode_assignment",
    "decode_envelope_request",
    "decode_envelope_response",
    "decode_principal",
    "decode_subscription",
    "encode_payload",
    "read_envelope_request",
    "read_envelope_response",
]

# Record batches (magic v2) and their compression codecs: docs/records.md.
from kafka_wire.compression import Compression  # noqa: E402
from kafka_wire.records import (  # noqa: E402
    BatchHeader,
    BatchView,
    ControlType,
    OpaqueEntry,
    Record,
    TimestampType,
    control_record,
    control_type,
    decode_records,
    encode_batch,
    iter_batches,
    record_offset,
    record_timestamp,
    rewrite_records,
    verify_crc,
)

__all__ += [
    "BatchHeader",
    "BatchView",
    "Compression",
    "ControlType",
    "OpaqueEntry",
    "Record",
    "TimestampType",
    "control_record",
    "control_type",
    "decode_records",
    "encode_batch",
    "iter_batches",
    "record_offset",
    "record_timestamp",
    "rewrite_records",
    "verify_crc",
]

# Error responses as Kafka's broker builds them, and per-topic refusals for partial
# denies: kafka_wire/error_responses.py.
from kafka_wire.error_responses import (  # noqa: E402
    ERROR_RESPONSE_APIS,
    PARTIAL_APIS,
    UnsupportedErrorResponse,
    error_response,
    expects_response,
    merge_error_entries,
    partial_error_entries,
    remove_topics,
)

__all__ += [
    "ERROR_RESPONSE_APIS",
    "PARTIAL_APIS",
    "UnsupportedErrorResponse",
    "error_response",
    "expects_response",
    "merge_error_entries",
    "partial_error_entries",
    "remove_topics",
]
