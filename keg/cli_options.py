"""Options that several keg commands take, declared once as a group: a frozen dataclass
whose fields are the options (named as the command line names them), and a decorator
that puts them on a command in place of one parameter of that dataclass's type."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from dataclasses import fields
from typing import Any


def option_group(options: type, option_types: Mapping[str, Any], param: str, *,
                 leave_out: tuple[str, ...] = ()) -> Callable[
        [Callable[..., None]], Callable[..., None]]:
    """A decorator for typer commands: the command's parameter `param` (typed `options`,
    with a default) is shown on the command line as one option per field of `options`
    but `leave_out`, each with its typer annotation from `option_types` and the field's
    default; the command is called with `param` built from them."""
    names = [f.name for f in fields(options) if f.name not in leave_out]
    defaults = {f.name: f.default for f in fields(options)}

    def decorate(command: Callable[..., None]) -> Callable[..., None]:
        signature = inspect.signature(command, eval_str=True)
        parameters: list[inspect.Parameter] = []
        for parameter in signature.parameters.values():
            if parameter.name != param:
                parameters.append(parameter)
                continue
            parameters.extend(
                inspect.Parameter(name, parameter.kind, default=defaults[name],
                                  annotation=option_types[name])
                for name in names)

        @functools.wraps(command)
        def run(*args: Any, **kwargs: Any) -> None:
            given = {name: kwargs.pop(name) for name in names}
            command(*args, **{param: options(**given)}, **kwargs)

        run.__signature__ = signature.replace(  # type: ignore[attr-defined]
            parameters=parameters)
        return run

    return decorate
