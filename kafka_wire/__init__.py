"""kafka_wire: the sans-IO Kafka protocol core (framing, correlation, message codec).

The package's public face, each part's `__all__` written once in its own module: the
message codec (`kafka_wire.codec`), record batches and their compression
(`kafka_wire.records`, docs/records.md), error responses as Kafka's broker builds
them and per-topic refusals for partial denies (`kafka_wire.error_responses`); and,
by name, the protocol enums, the errors, KIP-559 group payloads and KIP-590 envelopes.
"""

from kafka_wire import codec, error_responses, records
from kafka_wire.codec import *  # noqa: F403
from kafka_wire.enums import ApiKey, ErrorCode
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
from kafka_wire.error_responses import *  # noqa: F403
from kafka_wire.errors import DecodeError, EncodeError, KafkaWireError, UnknownApiError
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
from kafka_wire.records import *  # noqa: F403

__all__ = [
    "ApiKey",
    "DecodeError",
    "DecodedGroupPayload",
    "EncodeError",
    "ErrorCode",
    "ForwardedRequest",
    "ForwardedResponse",
    "GroupObservation",
    "GroupPayload",
    "GroupProtocolTracker",
    "Inconsistency",
    "KafkaWireError",
    "Principal",
    "UnknownApiError",
    "decode_assignment",
    "decode_envelope_request",
    "decode_envelope_response",
    "decode_principal",
    "decode_subscription",
    "encode_payload",
    "read_envelope_request",
    "read_envelope_response",
]
__all__ += codec.__all__
__all__ += records.__all__
__all__ += error_responses.__all__
