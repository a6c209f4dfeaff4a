"""RulesFilter without a network: decisions on decoded requests, envelopes included."""

from __future__ import annotations

from typing import Any

import kafka_wire
from ext_proc.connection import ConnectionInfo
from ext_proc.filters.rules import RuleDecision, RuleEngine, RulesFilter
from ext_proc.identity import IdentityTracker
from filter_rules import CompiledRuleSet, load_rule_text
from kafka_wire import ApiKey
from kafka_wire.envelope import Principal, envelope_request_body
from kafka_wire.records import BatchHeader, Record, encode_batch

RULES = """
rules:
  - id: payments-only-alice
    match: {apis: [Produce], topics: {prefix: [payments.]}, not: {principals: {exact: [alice]}}}
    action: {deny: {}}
"""
CONN = ConnectionInfo(client_host="10.0.0.5", client_port=5000, gateway_address="gw:19092")


def produce_body(*topics: str) -> dict[str, Any]:
    return {"TransactionalId": None, "Acks": -1, "TimeoutMs": 1000, "TopicData": [
        {"Name": t, "PartitionData": [{"Index": 0, "Records": b""}]} for t in topics]}


def rules_filter() -> tuple[RulesFilter, list[RuleDecision]]:
    decisions: list[RuleDecision] = []
    engine = RuleEngine(CompiledRuleSet(load_rule_text(RULES, "t.yaml")), decisions.append)
    return RulesFilter(engine, IdentityTracker()), decisions


def envelope(principal: str, *topics: str) -> tuple[kafka_wire.RequestHeader, dict[str, Any]]:
    inner = kafka_wire.RequestHeader(ApiKey.PRODUCE, 9, 77, "client-of-broker", {})
    body = envelope_request_body(inner, produce_body(*topics), Principal("User", principal),
                                 "192.0.2.9")
    header = kafka_wire.RequestHeader(ApiKey.ENVELOPE, 0, 5, "broker-1", {})
    decoded = kafka_wire.decode_body(ApiKey.ENVELOPE, 0, "request", kafka_wire.encode_body(
        ApiKey.ENVELOPE, 0, "request", body))[0]
    return header, decoded


def test_envelope_is_judged_as_its_inner_principal() -> None:
    f, decisions = rules_filter()
    assert f.wants_request(ApiKey.ENVELOPE, 0)
    assert f.judge(*envelope("alice", "payments.x"), CONN) is None

    verdict = f.judge(*envelope("bob", "payments.x"), CONN)
    assert verdict is not None and verdict.answer is not None
    assert verdict.answer["ErrorCode"] == 0  # the envelope itself succeeded...
    data = verdict.answer["ResponseData"]
    correlation_id, _tags, offset = kafka_wire.read_response_header(data, ApiKey.PRODUCE, 9)
    inner, _ = kafka_wire.decode_body(ApiKey.PRODUCE, 9, "response", data, offset)
    assert correlation_id == 77  # ...and carries the inner request's refusal
    assert inner["Responses"][0]["PartitionResponses"][0]["ErrorCode"] == 29
    assert [(d.principal, d.outcome, d.topic) for d in decisions] == [
        ("User:bob", "denied", "payments.x")]


def test_an_envelope_is_judged_as_its_sender_too() -> None:
    """The principal inside an envelope is what its sender wrote: a client a rule denies
    by its own principal named alice in an envelope, and was judged as alice."""
    rules = """
rules:
  - id: no-mallory
    match: {principals: {exact: [mallory]}}
    action: {deny: {}}
"""
    decisions: list[RuleDecision] = []
    engine = RuleEngine(CompiledRuleSet(load_rule_text(rules, "t.yaml")), decisions.append)
    identity = IdentityTracker()
    identity.learned_elsewhere("User:mallory", "SASL_PLAINTEXT")
    f = RulesFilter(engine, identity)
    verdict = f.judge(*envelope("alice", "payments.x"), CONN)
    assert verdict is not None and verdict.answer is not None
    assert verdict.answer["ErrorCode"] == 31  # CLUSTER_AUTHORIZATION_FAILED, the envelope's
    assert verdict.answer.get("ResponseData") is None
    assert [(d.principal, d.outcome) for d in decisions] == [("User:mallory", "denied")]
    # A broker's connection forwarding mallory's request: judged as mallory inside.
    broker = RulesFilter(engine, IdentityTracker())
    inner = broker.judge(*envelope("mallory", "payments.x"), CONN)
    assert inner is not None and inner.answer is not None and inner.answer["ErrorCode"] == 0


def test_partial_denial_inside_an_envelope_rewrites_the_inner_request() -> None:
    f, _ = rules_filter()
    header, body = envelope("bob", "payments.x", "other")
    verdict = f.judge(header, body, CONN)
    assert verdict is not None and verdict.changed and verdict.patch is not None
    _inner_header, inner_body = kafka_wire.decode_request(body["RequestData"])
    assert [t["Name"] for t in inner_body["TopicData"]] == ["other"]
    answer = kafka_wire.write_response_header(77, ApiKey.PRODUCE, 9) + kafka_wire.encode_body(
        ApiKey.PRODUCE, 9, "response", {"Responses": [{"Name": "other", "PartitionResponses": [
            {"Index": 0, "ErrorCode": 0, "BaseOffset": 5}]}]})
    response: dict[str, Any] = {"ErrorCode": 0, "ResponseData": answer}
    assert verdict.patch(response)
    _, merged = kafka_wire.decode_response(response["ResponseData"], ApiKey.PRODUCE, 9)
    codes = {t["Name"]: t["PartitionResponses"][0]["ErrorCode"] for t in merged["Responses"]}
    assert codes == {"other": 0, "payments.x": 29}


def test_direct_requests_use_the_connections_principal() -> None:
    f, decisions = rules_filter()
    header = kafka_wire.RequestHeader(ApiKey.PRODUCE, 9, 1, "c", {})
    verdict = f.judge(header, produce_body("payments.y"), CONN)  # ANONYMOUS
    assert verdict is not None and verdict.answer is not None
    assert decisions[0].principal == "User:ANONYMOUS"


LIMITS = """
rules:
  - id: try-small-fetches
    mode: dry-run
    match: {apis: [Fetch]}
    action: {safeguard: {max_fetch_bytes: 1000}}
  - id: bounded-fetches
    match: {apis: [Fetch], client_ids: {exact: [bounded]}}
    action: {safeguard: {max_fetch_bytes: 5000}}
"""


def fetch_body(max_bytes: int, partition_max: int) -> dict[str, Any]:
    return {"ReplicaId": -1, "MaxWaitMs": 500, "MinBytes": 1, "MaxBytes": max_bytes,
            "IsolationLevel": 0, "SessionId": 0, "SessionEpoch": -1, "Topics": [
                {"Topic": "t", "Partitions": [{"Partition": 0, "FetchOffset": 0,
                                               "PartitionMaxBytes": partition_max}]}]}


def test_a_dry_run_fetch_limit_never_changes_the_request() -> None:
    decisions: list[RuleDecision] = []
    engine = RuleEngine(CompiledRuleSet(load_rule_text(LIMITS, "l.yaml")), decisions.append)
    f = RulesFilter(engine, IdentityTracker())
    body = fetch_body(52_428_800, 1_048_576)
    assert f.judge(kafka_wire.RequestHeader(ApiKey.FETCH, 12, 1, "free", {}), body,
                            CONN) is None
    assert body == fetch_body(52_428_800, 1_048_576)  # as the client wrote it
    assert [(d.rule.id, d.outcome, d.reason) for d in decisions] == [
        ("try-small-fetches", "would-limit", "fetch of up to 52428800 bytes capped at 1000")]

    # Enforced, the cap applies; the dry-run rule still reports (and changes nothing).
    decisions.clear()
    verdict = f.judge(kafka_wire.RequestHeader(ApiKey.FETCH, 12, 2, "bounded", {}), body,
                               CONN)
    assert verdict is not None and verdict.changed
    assert body == fetch_body(5000, 5000)
    assert [(d.rule.id, d.outcome) for d in decisions] == [
        ("try-small-fetches", "would-limit"), ("bounded-fetches", "limited")]


REFUSALS = """
rules:
  - id: frozen
    match: {apis: [Produce], topics: {prefix: [frozen.]}}
    action: {deny: {error: POLICY_VIOLATION, message: "frozen topics take no writes"}}
  - id: schema-id-required
    match: {apis: [Produce], topics: {prefix: [typed.]}}
    action: {safeguard: {require_headers: [schema-id]}}
  - id: no-admin
    action: {deny_apis: [DeleteTopics]}
"""


def typed_batch(*headers: list[tuple[str, bytes | None]]) -> bytes:
    records = [Record(i, 0, None, b"{}", h) for i, h in enumerate(headers)]
    return encode_batch(BatchHeader(base_timestamp=1_700_000_000_000), records)


def refusing_filter() -> tuple[RulesFilter, list[RuleDecision]]:
    decisions: list[RuleDecision] = []
    engine = RuleEngine(CompiledRuleSet(load_rule_text(REFUSALS, "r.yaml")), decisions.append)
    return RulesFilter(engine, IdentityTracker()), decisions


def partition_answers(verdict: Any, version: int) -> dict[str, dict[str, Any]]:
    """Topic -> its partition answer, as the client decodes it (gateway answer or merged)."""
    if verdict.answer is not None:
        answer = verdict.answer
    else:
        answer = {"ThrottleTimeMs": 0, "Responses": []}
        assert verdict.patch(answer)
    data = kafka_wire.encode_body(ApiKey.PRODUCE, version, "response", answer)
    decoded, _ = kafka_wire.decode_body(ApiKey.PRODUCE, version, "response", data)
    return {t["Name"]: t["PartitionResponses"][0] for t in decoded["Responses"]}


def test_refusals_tell_the_client_the_rule_and_its_reason() -> None:
    f, decisions = refusing_filter()
    body = produce_body("frozen.a", "typed.b", "free")
    body["TopicData"][1]["PartitionData"][0]["Records"] = typed_batch(
        [("schema-id", b"1")], [], [("schema-id", b"2")])
    verdict = f.judge(kafka_wire.RequestHeader(ApiKey.PRODUCE, 9, 1, "c", {}), body, CONN)
    assert verdict is not None and verdict.changed
    assert [t["Name"] for t in body["TopicData"]] == ["free"]
    answers = partition_answers(verdict, 9)
    assert answers["frozen.a"]["ErrorCode"] == 44
    assert answers["frozen.a"]["ErrorMessage"] == "keg rule frozen: frozen topics take no writes"
    assert answers["frozen.a"]["RecordErrors"] == []  # no record is the culprit
    typed = answers["typed.b"]
    assert typed["ErrorCode"] == 87
    assert typed["ErrorMessage"] == \
        "keg rule schema-id-required: record 1: lacks header(s) schema-id"
    assert typed["RecordErrors"] == [{"BatchIndex": 1, "BatchIndexErrorMessage":
                                      typed["ErrorMessage"]}]
    assert {(d.rule.id, d.reason) for d in decisions} == {
        ("frozen", "frozen topics take no writes"),
        ("schema-id-required", "record 1: lacks header(s) schema-id")}

    # Produce v7 has neither field: the code alone. Other APIs carry the message too.
    old = f.judge(kafka_wire.RequestHeader(ApiKey.PRODUCE, 7, 2, "c", {}),
                           produce_body("frozen.a"), CONN)
    assert partition_answers(old, 7)["frozen.a"]["ErrorCode"] == 44
    delete = f.judge(kafka_wire.RequestHeader(ApiKey.DELETE_TOPICS, 6, 3, "c", {}), {
        "Topics": [{"Name": "x", "TopicId": None}], "TimeoutMs": 1000}, CONN)
    assert delete is not None and delete.answer is not None
    assert delete.answer["Responses"][0]["ErrorMessage"] == \
        "keg rule no-admin: DeleteTopics is not allowed"


def test_refusals_of_acks_zero_produce_are_marked_unanswered() -> None:
    f, decisions = refusing_filter()
    body = produce_body("frozen.a")
    body["Acks"] = 0
    verdict = f.judge(kafka_wire.RequestHeader(ApiKey.PRODUCE, 9, 1, "c", {}), body, CONN)
    assert verdict is not None and verdict.answer is not None
    assert not verdict.expects_response  # Kafka never answers acks=0: nor does keg
    assert [(d.outcome, d.answered) for d in decisions] == [("denied", False)]
    decisions.clear()
    f.judge(kafka_wire.RequestHeader(ApiKey.PRODUCE, 9, 2, "c", {}),
                     produce_body("frozen.a"), CONN)
    assert [(d.outcome, d.answered) for d in decisions] == [("denied", True)]


GROUP_RULES = """
rules:
  - id: no-locked
    match: {groups: {prefix: [locked-]}}
    action: {deny: {}}
  - id: no-hidden
    match: {groups: {prefix: [hidden-]}}
    action: {deny: {error: POLICY_VIOLATION}}
"""


def describe_groups(f: RulesFilter, *groups: str) -> Any:
    header = kafka_wire.RequestHeader(ApiKey.DESCRIBE_GROUPS, 5, 9, "admin", {})
    body: dict[str, Any] = {"Groups": list(groups), "IncludeAuthorizedOperations": False}
    return f.judge(header, body, CONN), body


def test_several_groups_are_refused_each_apart() -> None:
    """Each group a rule denies gets its own refusal (its rule's error); the others go
    on, and the broker's answer gets the refusals added. When none is left, the gateway
    answers them all itself."""
    engine = RuleEngine(CompiledRuleSet(load_rule_text(GROUP_RULES, "t.yaml")))
    f = RulesFilter(engine, IdentityTracker())
    verdict, body = describe_groups(f, "open-1", "locked-1", "hidden-1")
    assert verdict is not None and verdict.answer is None and verdict.changed
    assert body["Groups"] == ["open-1"]
    answer: dict[str, Any] = {"ThrottleTimeMs": 0,
                              "Groups": [{"ErrorCode": 0, "GroupId": "open-1"}]}
    assert verdict.patch is not None and verdict.patch(answer)
    assert [(g["GroupId"], g["ErrorCode"]) for g in answer["Groups"]] == [
        ("open-1", 0), ("locked-1", 30), ("hidden-1", 44)]

    verdict, _ = describe_groups(f, "locked-2", "hidden-2")
    assert verdict is not None and verdict.answer is not None
    assert sorted((g["GroupId"], g["ErrorCode"]) for g in verdict.answer["Groups"]) == [
        ("hidden-2", 44), ("locked-2", 30)]

    verdict, _ = describe_groups(f, "locked-3", "locked-4")  # one rule, every group
    assert verdict is not None and verdict.answer is not None
    assert {g["ErrorCode"] for g in verdict.answer["Groups"]} == {30}


CREATION = """
rules:
  - id: no-scratch
    match: {apis: [CreateTopics], topics: {prefix: [scratch.]}}
    action: {deny: {}}
  - id: try-drafts
    mode: dry-run
    match: {apis: [CreateTopics], topics: {prefix: [draft.]}}
    action: {deny: {}}
"""


def metadata(version: int, *topics: str, create: bool = True) -> tuple[
        kafka_wire.RequestHeader, dict[str, Any]]:
    body: dict[str, Any] = {"Topics": [{"Name": t} for t in topics]}
    if version >= 4:
        body["AllowAutoTopicCreation"] = create
    return kafka_wire.RequestHeader(ApiKey.METADATA, version, 3, "c", {}), body


def test_a_creation_deny_stops_auto_creation_and_refuses_only_what_was_missing() -> None:
    decisions: list[RuleDecision] = []
    engine = RuleEngine(CompiledRuleSet(load_rule_text(CREATION, "t.yaml")), decisions.append)
    f = RulesFilter(engine, IdentityTracker())
    assert f.wants_request(ApiKey.METADATA, 12)  # though no rule names Metadata

    header, body = metadata(12, "scratch.a", "scratch.b", "other")
    verdict = f.judge(header, body, CONN)
    assert verdict is not None and verdict.changed and verdict.patch is not None
    assert body["AllowAutoTopicCreation"] is False
    answer = {"Topics": [{"Name": "scratch.a", "ErrorCode": 3},
                         {"Name": "scratch.b", "ErrorCode": 0}, {"Name": "other", "ErrorCode": 3}]}
    assert verdict.patch(answer)
    # Missing and refused: Kafka's answer to an unauthorized creation; one that exists
    # is answered as it is; one no rule refuses keeps the broker's word.
    assert [t["ErrorCode"] for t in answer["Topics"]] == [29, 0, 3]
    assert [(d.outcome, d.topic) for d in decisions] == [("denied", "scratch.a")]


def test_a_dry_run_creation_deny_changes_nothing_and_what_asks_no_creation_is_not_judged() -> None:
    decisions: list[RuleDecision] = []
    engine = RuleEngine(CompiledRuleSet(load_rule_text(CREATION, "t.yaml")), decisions.append)
    f = RulesFilter(engine, IdentityTracker())
    header, body = metadata(12, "draft.a")
    verdict = f.judge(header, body, CONN)
    assert verdict is not None and not verdict.changed and verdict.patch is not None
    assert body["AllowAutoTopicCreation"] is True
    answer = {"Topics": [{"Name": "draft.a", "ErrorCode": 5}]}  # LEADER_NOT_AVAILABLE: made
    assert not verdict.patch(answer)
    assert [(d.outcome, d.topic) for d in decisions] == [("would-deny", "draft.a")]

    header, body = metadata(12, "scratch.a", create=False)
    assert f.judge(header, body, CONN) is None


def test_an_old_metadata_that_always_creates_is_refused_a_topic_denied_creating() -> None:
    decisions: list[RuleDecision] = []
    engine = RuleEngine(CompiledRuleSet(load_rule_text(CREATION, "t.yaml")), decisions.append)
    f = RulesFilter(engine, IdentityTracker())
    header, body = metadata(3, "scratch.a", "other")
    verdict = f.judge(header, body, CONN)
    assert verdict is not None and verdict.changed and verdict.patch is not None
    assert [t["Name"] for t in body["Topics"]] == ["other"]
    assert [(d.outcome, d.topic) for d in decisions] == [("denied", "scratch.a")]


def test_creation_denies_of_a_large_rule_set_are_found_through_its_index() -> None:
    rules = "rules:\n" + "".join(
        f"  - id: no-t{i}\n    match: {{apis: [CreateTopics], topics: {{exact: [t{i}]}}}}\n"
        f"    action: {{deny: {{}}}}\n" for i in range(50))
    decisions: list[RuleDecision] = []
    engine = RuleEngine(CompiledRuleSet(load_rule_text(rules, "t.yaml")), decisions.append)
    f = RulesFilter(engine, IdentityTracker())
    header, body = metadata(12, "t7", "t700")
    verdict = f.judge(header, body, CONN)
    assert verdict is not None and verdict.patch is not None
    answer = {"Topics": [{"Name": "t7", "ErrorCode": 3}, {"Name": "t700", "ErrorCode": 3}]}
    assert verdict.patch(answer)
    assert [t["ErrorCode"] for t in answer["Topics"]] == [29, 3]
    assert [(d.rule.id, d.topic) for d in decisions] == [("no-t7", "t7")]
