"""The API's request and response shapes (what the OpenAPI document shows).

Rules themselves are described by the rule language's own JSON Schema
(filter_rules.schema), registered in the OpenAPI components: `Rule` for one rule,
`RuleFileDocument` for a rule file's document.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema

from control_plane.api.dry_run import SampleRecord, SampleRequest
from control_plane.store import RuleDiff, StoredRule, Verdict, VersionInfo

RULE_REF = {"$ref": "#/components/schemas/Rule"}
RULE_FILE_REF = {"$ref": "#/components/schemas/RuleFileDocument"}
OWNER_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._@:/-]{0,199}$"

# allOf: pydantic resolves a bare $ref itself, and this one lives outside its models.
RuleJson = Annotated[dict[str, Any], WithJsonSchema({"allOf": [RULE_REF]})]


class _Out(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SourceOut(_Out):
    file: str
    line: int | None = None
    column: int | None = None


class RuleEntry(_Out):
    id: str
    etag: str = Field(description="The rule's ETag (a content hash), for If-Match.")
    owner: str | None = Field(description="The rule directory that owns it (GitOps), if any.")
    source: SourceOut | None = Field(description="Where it was written.")
    rule: RuleJson

    @classmethod
    def of(cls, stored: StoredRule) -> RuleEntry:
        source = SourceOut.model_validate(stored.source) if stored.source else None
        return cls(id=stored.id, etag=stored.etag, owner=stored.owner, source=source,
                   rule=stored.body)


Status = Literal["pending", "applied", "rejected"]
STATUS_DESCRIPTION = ("What the fleet made of the version: pending (no ext_proc instance "
                      "answered yet), applied (ACKed) or rejected (an instance NACKed it: it "
                      "is never served again and the fleet keeps the last good version).")


class VersionOut(_Out):
    number: int
    created_at: datetime
    author: str = Field(description="The API token's name that made the change.")
    reason: str
    operation: Literal["create", "update", "delete", "apply", "rollback"]
    ruleset_hash: str = Field(description="Content hash of the rules (what instances report).")
    rule_count: int
    parent: int | None = Field(description="For a rollback: the version it restored.")
    status: Status = Field(description=STATUS_DESCRIPTION)
    status_detail: str | None = Field(description=(
        "Which instance answered first; for a rejected version its error."))
    status_at: datetime | None = Field(description="When that answer came.")

    @classmethod
    def of(cls, info: VersionInfo, verdict: Verdict | None) -> VersionOut:
        return cls(number=info.number, created_at=info.created_at, author=info.author,
                   reason=info.reason, operation=info.operation,
                   ruleset_hash=info.ruleset_hash, rule_count=info.rule_count,
                   parent=info.parent, status=verdict.status if verdict else "pending",
                   status_detail=verdict.describe() if verdict else None,
                   status_at=verdict.at if verdict else None)


class RuleList(_Out):
    version: int = Field(description=(
        "The latest version, whose rules these are and on which writes build (0: no "
        "rules stored yet). It is not necessarily what the fleet runs: see status."))
    status: Status = Field(description=STATUS_DESCRIPTION)
    live_version: int | None = Field(description=(
        "The version the fleet runs: the newest one it applied and nobody rejected "
        "(null: none applied yet)."))
    rules: list[RuleEntry]


class RuleWriteOut(_Out):
    version: int = Field(description="The latest version after the write.")
    changed: bool = Field(description="False when the rule was already so (no new version).")
    created: bool
    new_version: VersionOut | None
    rule: RuleEntry


class DeleteOut(_Out):
    version: int
    new_version: VersionOut


class VersionList(_Out):
    versions: list[VersionOut]
    next_before: int | None = Field(description="Pass as `before` for the next page.")


class VersionDetail(_Out):
    info: VersionOut
    rules: list[RuleEntry]


class DiffOut(_Out):
    from_: str = Field(alias="from")
    to: str
    added: list[str]
    removed: list[str]
    changed: list[str]
    owners_changed: list[str]
    reordered: bool
    unchanged: int
    unified: str = Field(description="Unified diff of the rule sets as YAML.")

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    @classmethod
    def of(cls, diff: RuleDiff, from_name: str, to_name: str) -> DiffOut:
        return cls.model_validate({
            "from": from_name, "to": to_name, "added": list(diff.added),
            "removed": list(diff.removed), "changed": list(diff.changed),
            "owners_changed": list(diff.owners_changed), "reordered": diff.reordered,
            "unchanged": diff.unchanged, "unified": diff.unified,
        })


class ApplyIn(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    owner: Annotated[str, Field(pattern=OWNER_PATTERN, description=(
        "Who owns the rules afterwards, e.g. 'dir:rules' (keg apply: 'dir:<directory name>')."))]
    files: Annotated[dict[str, str], Field(max_length=10_000, description=(
        "The rule directory's files: name -> content (YAML), read in name order."))]
    reason: Annotated[str, Field(max_length=1000)] = ""
    adopt: bool = Field(default=False, description="Take over rules nobody owns yet.")


class ApplyOut(_Out):
    owner: str
    dry_run: bool
    version: int = Field(description="The latest version after the call.")
    status: Status = Field(description=f"Of the latest version. {STATUS_DESCRIPTION}")
    status_detail: str | None = Field(description="For a rejected version: who and why.")
    live_version: int | None = Field(description=(
        "The version the fleet runs (applied, not rejected); null: none yet."))
    new_version: VersionOut | None
    diff: DiffOut


class ValidateOut(_Out):
    valid: Literal[True]
    rules: int
    enabled: int
    ruleset_hash: str


class DryRunIn(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    rules: Annotated[str | dict[str, Any] | list[Any] | None, Field(description=(
        "The candidate rule set: a rule file's text (YAML or JSON) or its document; "
        "null: the live rules."))] = None
    requests: list[SampleRequest] = Field(default_factory=list)
    records: list[SampleRecord] = Field(default_factory=list)


class DryRunRuleset(_Out):
    source: Literal["live", "candidate"]
    version: int | None = Field(description=(
        "live: the version the fleet is served (never a rejected one)."))
    ruleset_hash: str


class DryRunOut(_Out):
    ruleset: DryRunRuleset
    requests: list[dict[str, Any]] = Field(description=(
        "Per request: verdict forward | forward-changed | answer, the answer or the "
        "forwarded body (bytes as {b64}), and each rule's decision."))
    records: list[dict[str, Any]] = Field(description=(
        "Per record: status unchanged | modified | dropped | rejected | failed, the "
        "record as it would leave the gateway, and each rule's step."))
    side_effects: list[dict[str, Any]] = Field(description="Copies and captures, not sent.")


class NackOut(_Out):
    version: str | None
    error: str
    at: datetime | None


class TypeStateOut(_Out):
    sent_version: str = Field(description="The version last sent to the node.")
    applied_version: str = Field(description="The version the node ACKed last (it runs it).")
    last_ack_at: datetime | None
    last_nack: NackOut | None = Field(description="Its last refusal: version and error.")
    in_sync: bool = Field(description="It ACKed what was sent last.")


class NodeOut(_Out):
    node_id: str
    role: Literal["envoy", "ext_proc"]
    cluster: str = Field(description="The node's group (node.cluster).")
    locality: str
    user_agent: str
    transport: str = Field(description="sotw or delta (ADS).")
    data_path: str = Field(default="", description=(
        "For an Envoy: the data path compiled for it, native (keg's Kafka filter) or "
        "ext-proc; empty before its first listeners."))
    module_error: str | None = Field(default=None, description=(
        "Why this Envoy could not load keg's Kafka filter (its NACK), which put it on the "
        "ext-proc data path until it reconnects; null otherwise."))
    connected: bool
    connected_at: datetime | None
    last_seen: datetime | None
    types: dict[str, TypeStateOut] = Field(description=(
        "Per resource type (Listener, Cluster, RuleSet): what was sent and applied."))


class FleetOut(_Out):
    available: bool = Field(description="False when this process has no fleet view.")
    nodes: list[NodeOut]


class ImpactRow(_Out):
    minute: datetime = Field(description="The minute (UTC) the row aggregates, by event time.")
    rule_id: str | None
    topic: str | None = Field(description="null for a decision about no topic.")
    principal: str | None
    outcome: str
    decisions: int = Field(description="Audit events (one per rule decision).")
    bytes: int
    records: int
    errors: int = Field(description="Decisions the gateway answered with an error code.")
    p50_latency_ms: float | None
    p99_latency_ms: float | None


class ImpactOut(_Out):
    available: bool = Field(description=(
        "False when this control plane has no impact directory (keg analyze --follow "
        "writes it)."))
    truncated: bool = Field(description="More rows matched than `limit`: the newest are "
                                        "returned.")
    rows: list[ImpactRow]


class HealthOut(_Out):
    status: Literal["ok"]
    version: int | None = None
