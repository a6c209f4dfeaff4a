"""Building blocks every part of the rule model shares (kept apart to avoid cycles)."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from filter_rules.patterns import PatternError, compile_re2


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


def _check_regex(pattern: str) -> str:
    try:
        compile_re2(pattern)
    except PatternError as exc:
        raise ValueError(f"invalid RE2 pattern '{pattern}': {exc}") from None
    return pattern


Regex = Annotated[
    str,
    AfterValidator(_check_regex),
    Field(description="An RE2 pattern; it must match the whole name."),
]
PositiveInt = Annotated[int, Field(gt=0)]


class StringMatch(_Model):
    """Matches a name equal to one of `exact`, starting with one of `prefix`, or
    matched whole by one of `regex` (RE2)."""

    exact: list[str] = []
    prefix: list[str] = []
    regex: list[Regex] = []

    @model_validator(mode="after")
    def _not_empty(self) -> StringMatch:
        if not (self.exact or self.prefix or self.regex):
            raise ValueError("give at least one of exact, prefix, regex (each a list)")
        return self
