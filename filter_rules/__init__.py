"""The rule language: model, loader, JSON Schema, compiled matchers and actions.

    ruleset = load_rule_dir()                    # filter_rules/rules/*.yaml by default
    compiled = CompiledRuleSet(ruleset)          # once per rule-set version
    ctx = MatchContext(api_key=0, api_version=9, principal="User:alice",
                       client_host="10.0.0.7")
    for rule in compiled.candidates(ctx.api_key, ctx.api_version, ctx.direction):
        if rule.matches(ctx, topic="payments.eu"):
            ...

The language is described in docs/rules.md. This package imports nothing of keg but
`kafka_wire`, and no I/O framework.
"""

from filter_rules._base import StringMatch
from filter_rules.apis import api_keys_by_name, resolve_api
from filter_rules.compiled import CompiledRule, CompiledRuleSet, StringMatcher, compile_rules
from filter_rules.context import MatchContext, normalize_principal, parse_host
from filter_rules.diagnostics import RuleError, RuleSetInvalid
from filter_rules.errors import default_deny_error, error_code, error_name
from filter_rules.loader import (
    DEFAULT_RULES_DIR,
    load_rule_data,
    load_rule_dir,
    load_rule_file,
    load_rule_text,
    locate_in_rule,
)
from filter_rules.model import (
    ACTION_KINDS,
    Action,
    ActionModel,
    AllowApisAction,
    AuditSpec,
    CompressionPolicy,
    DenyAction,
    DenyApisAction,
    DenySpec,
    Match,
    ObserveAction,
    ObserveSpec,
    RateAction,
    RateSpec,
    Rule,
    RuleFile,
    RuleSet,
    RuleSource,
    SafeguardAction,
    SafeguardSpec,
    VersionRange,
)

__all__ = [
    "ACTION_KINDS",
    "DEFAULT_RULES_DIR",
    "Action",
    "ActionModel",
    "AllowApisAction",
    "AuditSpec",
    "CompiledRule",
    "CompiledRuleSet",
    "CompressionPolicy",
    "DenyAction",
    "DenyApisAction",
    "DenySpec",
    "Match",
    "MatchContext",
    "ObserveAction",
    "ObserveSpec",
    "RateAction",
    "RateSpec",
    "Rule",
    "RuleError",
    "RuleFile",
    "RuleSet",
    "RuleSetInvalid",
    "RuleSource",
    "SafeguardAction",
    "SafeguardSpec",
    "StringMatch",
    "StringMatcher",
    "VersionRange",
    "api_keys_by_name",
    "compile_rules",
    "default_deny_error",
    "error_code",
    "error_name",
    "load_rule_data",
    "load_rule_dir",
    "load_rule_file",
    "load_rule_text",
    "locate_in_rule",
    "normalize_principal",
    "parse_host",
    "resolve_api",
]
