"""kafka_wire.ApiKey and kafka_wire.ErrorCode: generated, and up to date with their sources."""

from __future__ import annotations

import shutil

import pytest

import kafka_wire
from kafka_wire import ApiKey, ErrorCode
from tools import gen_protocol_enums as gen


def checked_in_errors() -> list[gen.ErrorSpec]:
    return [gen.ErrorSpec(e.name, e.value, e.retriable, e.message) for e in ErrorCode]


def test_checked_in_module_is_up_to_date_with_the_schemas() -> None:
    # API keys regenerated from the schemas; errors as the module holds them (their
    # source, Kafka's Errors.java, is checked below when its jar is at hand).
    text = gen.render(gen.api_keys_from_schemas(), checked_in_errors())
    assert gen.OUTPUT.read_text(encoding="utf-8") == text, (
        "kafka_wire/enums.py is stale or edited by hand: run tools/gen_protocol_enums.py")


def test_errors_are_kafkas() -> None:
    # Fetched from Maven Central once (keg's set-up needs Maven anyway): on a fresh
    # machine a missing jar must not turn this check into a skip.
    if not gen.SOURCES_JAR.exists() and shutil.which("mvn") is None:
        pytest.skip(f"no {gen.SOURCES_JAR.name} and no mvn to fetch it")
    assert gen.errors_from_jar(gen.fetch_sources_jar()) == checked_in_errors()


def test_every_known_api_has_a_key_and_its_schema_name() -> None:
    assert [int(k) for k in ApiKey] == kafka_wire.known_api_keys()
    for key in ApiKey:
        assert kafka_wire.api_name(key) == key.schema_name
    assert (ApiKey.PRODUCE, ApiKey.FETCH, ApiKey.SHARE_FETCH) == (0, 1, 78)
    assert ApiKey.DESCRIBE_TOPIC_PARTITIONS.schema_name == "DescribeTopicPartitions"


def test_errors_carry_retriability_and_message() -> None:
    assert ErrorCode.NONE == 0 and ErrorCode.NONE.message is None
    assert ErrorCode.UNKNOWN_SERVER_ERROR == -1
    assert ErrorCode.TOPIC_AUTHORIZATION_FAILED.message == "Topic authorization failed."
    assert ErrorCode.LEADER_NOT_AVAILABLE.retriable
    assert ErrorCode.REQUEST_TIMED_OUT.retriable
    assert not ErrorCode.TOPIC_AUTHORIZATION_FAILED.retriable
    assert not ErrorCode.POLICY_VIOLATION.retriable
    codes = [int(e) for e in ErrorCode]
    assert codes == list(range(-1, len(codes) - 1)), "codes are contiguous from -1"


def test_java_sources_are_read_exactly() -> None:
    errors_java = '''
    public enum Errors {
        UNKNOWN_SERVER_ERROR(-1, "The server experienced an unexpected error.",
                UnknownServerException::new),
        NONE(0, null, message -> null),
        NOT_LEADER_OR_FOLLOWER(6, "For requests intended only for the leader, " +
                "this error says \\"not\\" the leader.",
                NotLeaderOrFollowerException::new),
        LAST(7, "Last.", LastException::new);
    '''
    classes = ["public class NotLeaderOrFollowerException extends InvalidMetadataException {",
               "public abstract class InvalidMetadataException extends RetriableException {",
               "public class LastException extends ApiException {"]
    assert gen.errors_from_sources(errors_java, classes) == [
        gen.ErrorSpec("UNKNOWN_SERVER_ERROR", -1, False,
                      "The server experienced an unexpected error."),
        gen.ErrorSpec("NONE", 0, False, None),
        gen.ErrorSpec("NOT_LEADER_OR_FOLLOWER", 6, True,
                      'For requests intended only for the leader, this error says "not" the '
                      "leader."),
        gen.ErrorSpec("LAST", 7, False, "Last."),
    ]
    assert gen.upper_snake("ApiVersions") == "API_VERSIONS"
    assert gen.upper_snake("OffsetForLeaderEpoch") == "OFFSET_FOR_LEADER_EPOCH"
