"""Kafka error codes by name, as Apache Kafka's `Errors.java` spells them.

Rule files name errors (`deny: {error: TOPIC_AUTHORIZATION_FAILED}`); the data path
writes the code into the response it makes. Names are exactly Kafka's (code 7 is
`REQUEST_TIMED_OUT`, code 10 `MESSAGE_TOO_LARGE`, -1 `UNKNOWN_SERVER_ERROR`): the
table is `kafka_wire.ErrorCode`, generated from Kafka's source.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Final

from kafka_wire import ApiKey, ErrorCode

#: Every error of Kafka's protocol, name -> code.
ERROR_CODES: Final = MappingProxyType({e.name: e for e in ErrorCode})

ERROR_NAMES: Final = MappingProxyType({int(e): e.name for e in ErrorCode})


def error_code(name: str) -> ErrorCode:
    """The code of a Kafka error name: "POLICY_VIOLATION" -> 44. KeyError if unknown."""
    return ERROR_CODES[name]


def error_name(code: int) -> str | None:
    """The name of a Kafka error code, None for a code this table does not know."""
    return ERROR_NAMES.get(code)


# --- Which error a `deny` answers with when the rule names none --------------------

_TOPIC_APIS = frozenset({
    ApiKey.PRODUCE, ApiKey.FETCH, ApiKey.LIST_OFFSETS, ApiKey.METADATA,
    ApiKey.CREATE_TOPICS, ApiKey.DELETE_TOPICS, ApiKey.DELETE_RECORDS,
    ApiKey.OFFSET_FOR_LEADER_EPOCH, ApiKey.CREATE_PARTITIONS, ApiKey.DESCRIBE_PRODUCERS,
    ApiKey.DESCRIBE_TOPIC_PARTITIONS, ApiKey.SHARE_FETCH, ApiKey.SHARE_ACKNOWLEDGE,
})
_GROUP_APIS = frozenset({
    ApiKey.OFFSET_COMMIT, ApiKey.OFFSET_FETCH, ApiKey.FIND_COORDINATOR,
    ApiKey.JOIN_GROUP, ApiKey.HEARTBEAT, ApiKey.LEAVE_GROUP, ApiKey.SYNC_GROUP,
    ApiKey.DESCRIBE_GROUPS, ApiKey.DELETE_GROUPS, ApiKey.OFFSET_DELETE,
    ApiKey.CONSUMER_GROUP_HEARTBEAT, ApiKey.CONSUMER_GROUP_DESCRIBE,
    ApiKey.SHARE_GROUP_HEARTBEAT, ApiKey.SHARE_GROUP_DESCRIBE,
})
_TRANSACTION_APIS = frozenset({
    ApiKey.INIT_PRODUCER_ID, ApiKey.ADD_PARTITIONS_TO_TXN, ApiKey.ADD_OFFSETS_TO_TXN,
    ApiKey.END_TXN, ApiKey.TXN_OFFSET_COMMIT, ApiKey.DESCRIBE_TRANSACTIONS,
})
_DELEGATION_TOKEN_APIS = frozenset({
    ApiKey.CREATE_DELEGATION_TOKEN, ApiKey.RENEW_DELEGATION_TOKEN,
    ApiKey.EXPIRE_DELEGATION_TOKEN, ApiKey.DESCRIBE_DELEGATION_TOKEN,
})


def default_deny_error(api_key: int) -> ErrorCode:
    """The authorization error Kafka itself answers a refused request of this API with.

    Topic APIs -> TOPIC_AUTHORIZATION_FAILED, group APIs -> GROUP_AUTHORIZATION_FAILED,
    transactional APIs -> TRANSACTIONAL_ID_AUTHORIZATION_FAILED, delegation tokens ->
    DELEGATION_TOKEN_AUTHORIZATION_FAILED, everything else (admin, cluster, unknown
    keys) -> CLUSTER_AUTHORIZATION_FAILED.
    """
    if api_key in _TOPIC_APIS:
        return ErrorCode.TOPIC_AUTHORIZATION_FAILED
    if api_key in _GROUP_APIS:
        return ErrorCode.GROUP_AUTHORIZATION_FAILED
    if api_key in _TRANSACTION_APIS:
        return ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    if api_key in _DELEGATION_TOKEN_APIS:
        return ErrorCode.DELEGATION_TOKEN_AUTHORIZATION_FAILED
    return ErrorCode.CLUSTER_AUTHORIZATION_FAILED


#: The error each safeguard check answers with when the rule names none.
SAFEGUARD_ERRORS: Final = MappingProxyType({
    "forbid_acks_zero": ErrorCode.INVALID_REQUIRED_ACKS,
    "require_idempotence": ErrorCode.POLICY_VIOLATION,
    "require_transactions": ErrorCode.POLICY_VIOLATION,
    "max_batch_bytes": ErrorCode.RECORD_LIST_TOO_LARGE,
    "max_record_bytes": ErrorCode.MESSAGE_TOO_LARGE,
    "compression": ErrorCode.UNSUPPORTED_COMPRESSION_TYPE,
    "max_headers": ErrorCode.INVALID_RECORD,
    "require_headers": ErrorCode.INVALID_RECORD,
    "max_fetch_bytes": ErrorCode.POLICY_VIOLATION,
    "read_only": ErrorCode.TOPIC_AUTHORIZATION_FAILED,
})
