"""Kafka error names and codes, and the default error of a deny."""

from __future__ import annotations

import pytest

from filter_rules import default_deny_error, error_code, error_name
from filter_rules.errors import ERROR_CODES, ERROR_NAMES
from kafka_wire import ApiKey

# The codes the brief names, from Apache Kafka's Errors.java.
REQUIRED = {
    "TOPIC_AUTHORIZATION_FAILED": 29, "GROUP_AUTHORIZATION_FAILED": 30,
    "CLUSTER_AUTHORIZATION_FAILED": 31, "POLICY_VIOLATION": 44, "INVALID_RECORD": 87,
    "UNSUPPORTED_COMPRESSION_TYPE": 76, "REQUEST_TIMED_OUT": 7, "UNKNOWN_SERVER_ERROR": -1,
    "THROTTLING_QUOTA_EXCEEDED": 89, "INVALID_REQUIRED_ACKS": 21, "MESSAGE_TOO_LARGE": 10,
    "RECORD_LIST_TOO_LARGE": 18, "TRANSACTIONAL_ID_AUTHORIZATION_FAILED": 53,
    "DELEGATION_TOKEN_AUTHORIZATION_FAILED": 65, "INVALID_CONFIG": 40,
    "UNSUPPORTED_VERSION": 35, "INVALID_REQUEST": 42,
}


def test_required_codes() -> None:
    for name, code in REQUIRED.items():
        assert error_code(name) == code
        assert error_name(code) == name
    assert error_name(5000) is None
    with pytest.raises(KeyError):
        error_code("REQUEST_TIMEOUT")  # Kafka's name is REQUEST_TIMED_OUT


def test_table_is_one_to_one() -> None:
    assert len(ERROR_NAMES) == len(ERROR_CODES)
    assert sorted(ERROR_CODES.values()) == list(range(-1, 134))  # Kafka 4.1.1: up to 133


# kafka-python spells a few errors differently from Errors.java.
KAFKA_PYTHON_NAMES = {
    "UNKNOWN": "UNKNOWN_SERVER_ERROR", "NO_ERROR": "NONE",
    "NOT_LEADER_FOR_PARTITION": "NOT_LEADER_OR_FOLLOWER", "MESSAGE_SIZE_TOO_LARGE":
    "MESSAGE_TOO_LARGE", "INVALID_TOPIC": "INVALID_TOPIC_EXCEPTION",
    "INVALID_REPLICATION_ASSIGNMENT": "INVALID_REPLICA_ASSIGNMENT",
}


def test_codes_agree_with_kafka_python() -> None:
    errors = pytest.importorskip("kafka.errors")
    seen = 0
    for value in vars(errors).values():
        if not (isinstance(value, type) and issubclass(value, errors.BrokerResponseError)):
            continue
        code = getattr(value, "errno", None)
        if not isinstance(code, int) or code not in ERROR_NAMES:
            continue
        message: str = getattr(value, "message", "")
        assert ERROR_NAMES[code] == KAFKA_PYTHON_NAMES.get(message, message), (code, message)
        seen += 1
    assert seen >= 100


@pytest.mark.parametrize(("api_key", "expected"), [
    (ApiKey.PRODUCE, "TOPIC_AUTHORIZATION_FAILED"),
    (ApiKey.FETCH, "TOPIC_AUTHORIZATION_FAILED"),
    (ApiKey.CREATE_TOPICS, "TOPIC_AUTHORIZATION_FAILED"),
    (ApiKey.JOIN_GROUP, "GROUP_AUTHORIZATION_FAILED"),
    (ApiKey.OFFSET_COMMIT, "GROUP_AUTHORIZATION_FAILED"),
    (ApiKey.INIT_PRODUCER_ID, "TRANSACTIONAL_ID_AUTHORIZATION_FAILED"),
    (ApiKey.CREATE_DELEGATION_TOKEN, "DELEGATION_TOKEN_AUTHORIZATION_FAILED"),
    (ApiKey.ALTER_CONFIGS, "CLUSTER_AUTHORIZATION_FAILED"),
    (9999, "CLUSTER_AUTHORIZATION_FAILED"),
])
def test_default_deny_error(api_key: int, expected: str) -> None:
    assert default_deny_error(api_key) == error_code(expected)
