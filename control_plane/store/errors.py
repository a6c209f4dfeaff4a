"""The store's exception tree: what callers (the REST API, the CLI) translate to answers.

SQL drivers' errors never leave the store: they become `StoreUnavailable`.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from control_plane.store.entries import REST_OWNED

__all__ = [
    "InvalidChange",
    "OutOfScope",
    "PreconditionFailed",
    "PreconditionRequired",
    "RuleNotFound",
    "RuleOwned",
    "ServedDirectory",
    "StoreError",
    "StoreUnavailable",
    "VersionNotFound",
]


class StoreError(Exception):
    """Base of every error the rule store raises."""


class StoreUnavailable(StoreError):
    """The database cannot be reached or refused the operation (a driver error)."""


class RuleNotFound(StoreError):
    def __init__(self, rule_id: str) -> None:
        super().__init__(f"no rule '{rule_id}'")
        self.rule_id = rule_id


class VersionNotFound(StoreError):
    def __init__(self, number: int) -> None:
        super().__init__(f"no version {number}")
        self.number = number


class PreconditionFailed(StoreError):
    """An If-Match / If-None-Match condition does not hold (HTTP 412)."""

    def __init__(self, message: str, current_etag: str | None = None) -> None:
        super().__init__(message)
        self.current_etag = current_etag


class PreconditionRequired(StoreError):
    """An update or delete without the ETag it would overwrite (HTTP 428)."""


# The owner RuleOwned names for rules written through the REST API (adopt takes them).
NOBODY = "nobody: written through the REST API"


class RuleOwned(StoreError):
    """A write to rules that a rule directory (GitOps) owns, by someone else (HTTP 409)."""

    def __init__(self, owners: dict[str, str], writer: str | None) -> None:
        self.owners = dict(owners)  # rule id -> owner
        listed = ", ".join(f"'{rule_id}' ({owner})" for rule_id, owner in sorted(owners.items()))
        if writer is None:
            message = (
                f"rule(s) {listed} are owned by a rule directory (GitOps): change them in "
                "that directory, not through the REST API (`keg up --rules DIR` applies "
                "its own directory by itself; `keg apply DIR` applies any other)"
            )
        else:
            message = (
                f"rule(s) {listed} are not owned by {writer}; a rule directory may only "
                "change its own rules"
            )
            others = sorted(set(owners.values()))
            if others == [NOBODY]:
                message += " (pass adopt to take over rules nobody owns)"
            elif len(others) == 1:  # one directory owns them: name how to write as it
                message += (
                    f". To compare or apply as their owner, pass --owner {others[0]} (`keg "
                    "up --rules DIR` owns the rules of DIR as dir:<its full path>); adopt "
                    "takes over only rules nobody owns"
                )
        super().__init__(message)


class ServedDirectory(StoreError):
    """`keg apply` as the owner of the rule directory `keg up --rules` serves (HTTP 409):
    that directory's files are its rules, and keg up applies them again at once (the
    applied version was undone in the same millisecond while the CLI said "applied")."""

    def __init__(self, owner: str) -> None:
        self.owner = owner
        super().__init__(
            f"{owner} is the rule directory this control plane serves: its files are its "
            "rules, and it applies them itself within a second of a change. Change the "
            "files there, or apply another directory under an owner of its own")


class OutOfScope(StoreError):
    """A change to rules of owners outside the writer's scope (HTTP 403)."""

    def __init__(self, owners: Collection[str | None], scope: str) -> None:
        # The owners the change would touch that the scope does not cover.
        self.owners = sorted(f"{REST_OWNED} (written through REST)" if owner is None else owner
                             for owner in owners)
        super().__init__(f"this token may change the rules of {scope} only; the change "
                         f"touches rules of {', '.join(self.owners)}")


class InvalidChange(StoreError):
    """A change the store refuses for its content (e.g. a rule id that does not match)."""

    def __init__(self, message: str, field: str = "") -> None:
        super().__init__(message)
        self.field = field


def owners_of(rule_ids: Sequence[str], owners: dict[str, str | None]) -> dict[str, str]:
    """The owned ones among `rule_ids`, with their owners."""
    return {rule_id: owner for rule_id in rule_ids if (owner := owners.get(rule_id))}
