"""The secrets a rule set names, checked the way the ext_proc service will read them.

Rule files never hold secrets: an encryption key or a hash key is named by an
environment variable or a file (`{env: KEG_CARD_KEY}`, `{file: keys/cards}`), read when
the record rules are built. `check_secrets` reads every one the enabled rules name,
with the same readers the built-in actions use, and reports each that is missing or
unusable at the line of its `env:` / `file:` (`keg validate`). No secret's value is
ever part of a message.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from filter_rules import Rule, RuleError, RuleSet, locate_in_rule
from filter_rules.loader import format_path
from filter_rules.record_actions import EncryptionKey, KmsKeyring, SecretRef
from interceptors.contract import BuildContext, InterceptorConfigError
from interceptors.keys import read_aes_key, read_hash_key, read_secret
from interceptors.kms import read_keyring

FieldPath = tuple[str | int, ...]
# Reads one secret as the interceptor will; raises InterceptorConfigError.
Reader = Callable[[BuildContext], object]


@dataclass(frozen=True, slots=True)
class SecretUse:
    """One place a rule names a secret: the path from the rule to its `env`/`file`."""

    rule_id: str
    path: FieldPath
    read: Reader
    ref: SecretRef


def secret_uses(rule: Rule) -> list[SecretUse]:
    """Every secret `rule` names, found by walking its action (so a new action with a
    key is covered without a list to keep up to date)."""
    return list(_walk(rule.id, rule.action, ("action",)))


def _walk(rule_id: str, value: Any, path: FieldPath) -> Iterator[SecretUse]:
    if isinstance(value, EncryptionKey):
        key = value
        yield SecretUse(rule_id, (*path, "secret", _source(key.secret)),
                        lambda ctx: read_aes_key(key.secret, ctx, key.id), key.secret)
    elif isinstance(value, KmsKeyring):
        ring = value
        yield SecretUse(rule_id, (*path, "secret", _source(ring.secret)),
                        lambda ctx: read_keyring(ring, ctx), ring.secret)
    elif isinstance(value, SecretRef):
        ref = value
        if path[-1] == "hash_key":
            yield SecretUse(rule_id, (*path, _source(ref)), lambda ctx: read_hash_key(ref, ctx),
                            ref)
        else:
            yield SecretUse(rule_id, (*path, _source(ref)),
                            lambda ctx: read_secret(ref, ctx, str(path[-1])), ref)
    elif isinstance(value, BaseModel):
        for name, field in type(value).model_fields.items():
            yield from _walk(rule_id, getattr(value, name), (*path, field.alias or name))
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            yield from _walk(rule_id, item, (*path, index))
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _walk(rule_id, item, (*path, str(key)))


def _source(ref: SecretRef) -> str:
    return "env" if ref.env is not None else "file"


def secret_env_names(ruleset: RuleSet) -> set[str]:
    """The environment variables the enabled rules of `ruleset` read secrets from: what
    the process that builds those rules (the ext_proc service) must be given."""
    return {use.ref.env for rule in ruleset.rules if rule.mode != "disabled"
            for use in secret_uses(rule) if use.ref.env is not None}


def env_refs_outside(ruleset: RuleSet, available: Collection[str], why: str
                     ) -> list[RuleError]:
    """One error, at its line, per secret an enabled rule reads from an environment
    variable not in `available` (`why`: what those are, for the message)."""
    errors = []
    for rule in ruleset.rules:
        if rule.mode == "disabled":
            continue
        source = ruleset.sources.get(rule.id)
        for use in secret_uses(rule):
            if use.ref.env is None or use.ref.env in available:
                continue
            where = locate_in_rule(source, use.path) if source is not None else None
            errors.append(RuleError(
                where.file if where else "<rules>", where.line if where else None,
                where.column if where else None, f"{rule.id}.{format_path(use.path)}",
                f"environment variable {use.ref.env} is not given to {why}"))
    return errors


def check_secrets(ruleset: RuleSet, environ: Mapping[str, str] | None = None,
                  kinds: Collection[str] = ("env", "file")) -> tuple[int, list[RuleError]]:
    """Read every secret the enabled rules of `ruleset` name (environment variables from
    `environ`, default the process's; files relative to the rule's file), of the `kinds`
    given (`env`, `file`). Returns how many were checked and one error per missing or
    unusable one, at its line."""
    checked, errors = 0, []
    for rule in ruleset.rules:
        if rule.mode == "disabled":  # never built, so never read
            continue
        source = ruleset.sources.get(rule.id)
        base_dir = Path(source.file).parent if source is not None else Path.cwd()
        context = BuildContext(base_dir=base_dir, environ=environ)
        for use in secret_uses(rule):
            if _source(use.ref) not in kinds:
                continue
            checked += 1
            try:
                use.read(context)
            except InterceptorConfigError as err:
                where = locate_in_rule(source, use.path) if source is not None else None
                errors.append(RuleError(
                    where.file if where else "<rules>", where.line if where else None,
                    where.column if where else None, f"{rule.id}.{format_path(use.path)}",
                    str(err)))
    return checked, errors
