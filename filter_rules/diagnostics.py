"""What the loader reports: one RuleError per problem, raised together as RuleSetInvalid."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RuleError:
    """One problem in a rule file, at the line and column of the offending key.

    `line` and `column` count from 1 and are None for problems of a whole file or
    directory (it cannot be read). `field_path` reads like `rules[0].match.topics`;
    it is empty for problems of the document itself.
    """

    file: str
    line: int | None
    column: int | None
    field_path: str
    message: str

    def __str__(self) -> str:
        where = self.file
        if self.line is not None:
            where += f":{self.line}:{self.column or 1}"
        if self.field_path:
            return f"{where}: {self.field_path}: {self.message}"
        return f"{where}: {self.message}"


class RuleSetInvalid(ValueError):
    """The rule set cannot be loaded; `errors` lists every problem found, in file order.

    `str()` gives one line per problem: `file:line:column: field.path: message`.
    """

    def __init__(self, errors: Iterable[RuleError]) -> None:
        self.errors: tuple[RuleError, ...] = tuple(errors)
        super().__init__("\n".join(str(error) for error in self.errors))

    def __str__(self) -> str:
        return "\n".join(str(error) for error in self.errors)
