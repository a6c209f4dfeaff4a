"""What keg's commands print through rich: user text as written, never cropped off a terminal.

Every rich console of the CLI comes from `make_console`. Its markup and emoji codes are
off, so a rule id, a path, a topic, an owner such as `dir:watch:` or an error message
prints exactly as written (rich would turn `:watch:` into an emoji and eat `[red]`);
keg's own colours go through `styled()`, whose plain parts are never interpreted.
Off a terminal (a pipe, a file, CI logs) nothing is wrapped or cropped: rich would
otherwise cut every line at 80 columns.
"""

from __future__ import annotations

from typing import Final

from rich.console import Console
from rich.progress import TextColumn
from rich.text import Text

# Off a terminal: wide enough that no line of keg's output is ever wrapped or cropped.
UNBOUNDED_WIDTH: Final = 1 << 20

Part = str | Text | tuple[str, str]  # plain text, or (text, style)


def make_console(stderr: bool = True) -> Console:
    console = Console(stderr=stderr, markup=False, emoji=False, highlight=False,
                      soft_wrap=True)
    if not console.is_terminal:
        console.width = UNBOUNDED_WIDTH
    return console


def styled(*parts: Part) -> Text:
    """Text from plain strings, Text and (text, style) pairs; nothing is read as markup."""
    return Text.assemble(*parts)


def plain_column(style: str = "") -> TextColumn:
    """A progress column showing the task's description as written (no markup)."""
    return TextColumn("{task.description}", style=style, markup=False)


def error_line(message: str) -> Text:
    return styled(("error:", "red"), " ", message)
