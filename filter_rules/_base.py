"""Building blocks every part of the rule model shares (kept apart to avoid cycles)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Final, Generic, Self, TypeVar, cast

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from filter_rules.patterns import PatternError, compile_re2


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class _OneOf(_Model):
    """A model where exactly one of some fields is given, named as a class keyword:
    `class SecretRef(_OneOf, one_of=("env", "file"))`. Its check runs before the
    subclass's own validators; the error names the fields as a rule file spells them
    (their aliases)."""

    one_of: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, one_of: tuple[str, ...] = (), **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if one_of:
            cls.one_of = one_of

    @model_validator(mode="after")
    def _exactly_one(self) -> Self:
        if sum(getattr(self, name) is not None for name in self.one_of) != 1:
            fields = type(self).model_fields
            shown = ", ".join(fields[name].alias or name for name in self.one_of)
            raise ValueError(f"give exactly one of {shown}")
        return self


# The most of a refused pattern an error quotes (a 400,000-character one filled a log
# line and a REST problem twice, its reason at the very end).
_QUOTED_PATTERN: Final = 80


def _check_regex(pattern: str) -> str:
    try:
        compile_re2(pattern)
    except PatternError as exc:
        quoted = (f"'{pattern}'" if len(pattern) <= _QUOTED_PATTERN else
                  f"'{pattern[:_QUOTED_PATTERN]}...' ({len(pattern)} characters)")
        raise ValueError(f"invalid RE2 pattern {quoted}: {exc}") from None
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


SpecT = TypeVar("SpecT")


class KindAction(_Model, Generic[SpecT]):
    """A rule's action: one mapping key, its kind, holding its spec (`mask: {...}`).

    Every action is this one shape, written as `class MaskAction(KindAction[MaskSpec],
    kind="mask")` with a docstring (the schema's description) and no body. Its one
    field is named after the kind (`validate_` and `copy_` where the kind would shadow
    a pydantic method, with the kind as alias); `spec` reads it whatever its name."""

    kind: ClassVar[str]

    if TYPE_CHECKING:  # the kind's field, which __init_subclass__ declares
        def __getattr__(self, name: str) -> Any: ...

    def __init_subclass__(cls, kind: str = "", **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if not kind:  # KindAction[Spec] itself, as pydantic parametrizes it
            return
        cls.kind = kind
        generic = (base.__dict__.get("__pydantic_generic_metadata__") for base in cls.__mro__)
        spec = next(meta["args"][0] for meta in generic if meta and meta["args"])
        name = spec_field(kind)
        cls.__annotations__ = {name: spec}
        if name != kind:
            setattr(cls, name, Field(alias=kind))

    @property
    def spec(self) -> SpecT:
        return cast(SpecT, getattr(self, spec_field(self.kind)))


def spec_field(kind: str) -> str:
    """The attribute holding an action's spec: its kind, unless pydantic has that name."""
    return f"{kind}_" if hasattr(BaseModel, kind) else kind
