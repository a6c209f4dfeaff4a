"""The exceptions of kafka_wire: everything it raises for bad input is one of these."""


class KafkaWireError(ValueError):
    """Base of kafka_wire's errors about the bytes it was given."""


class FrameError(KafkaWireError):
    """The byte stream is not a valid sequence of Kafka frames (size, order, correlation)."""


class DecodeError(KafkaWireError):
    """The bytes are not a valid message of the expected API, version and kind."""


class EncodeError(KafkaWireError):
    """The value cannot be written as a message of the requested API, version and kind."""


class UnknownApiError(DecodeError, EncodeError):
    """The API key, version, kind or schema name is not in kafka_wire's schema set.

    Both a DecodeError and an EncodeError, so either handler catches it; catch it first
    to forward frames of APIs the codec does not know untouched.
    """
