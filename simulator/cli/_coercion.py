"""Command-line values converted without pydantic where typer's conversion is plain.

typer (0.29) converts every parameter's value through a pydantic ``TypeAdapter`` that it
builds as the command line is parsed, one a parameter whether given or not: pydantic's
import and some seventy adapters cost a replay about 0.15 CPU-seconds, a third of a small
replay's start. Most values need none of it: an option left out is ``None``, and a number,
a word or a path written plainly converts the same way by Python's own ``int``, ``float``,
``str`` and ``Path``. :func:`plain_values` gives each parameter of a built command a
conversion that does those itself and hands everything else — a value in any other form,
one out of its bounds, any other type — to typer's own, built only then, so that what is
accepted and every error message stay typer's (``tests/test_cli_coercion.py`` holds the two
equal over drawn values).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, get_args, get_origin

#: Integers and decimal numbers as written plainly (no sign but a minus, no leading zero,
#: no underscore, no space): what Python's int and float read as pydantic reads them.
_INTEGER = re.compile(r"-?(?:0|[1-9][0-9]{0,17})")
_DECIMAL = re.compile(r"-?(?:0|[1-9][0-9]{0,17})(?:\.[0-9]{1,17})?(?:[eE][-+]?[0-9]{1,3})?")
#: The conversion declined: typer's own converts the value.
_TYPERS = object()


def _bounded(value: int | float, info: Any) -> int | float | object:
    if (info.min is not None and not value >= info.min) or (info.max is not None and not value <= info.max):
        return _TYPERS  # (typer's own says which bound, in its words)
    return value


def plain_value(annotation: Any, info: Any, value: Any) -> Any:
    """``value`` converted to ``annotation`` as typer converts it, or :data:`_TYPERS` where
    this does not know how (typer's own conversion then runs)."""
    if getattr(info, "parser", None) is not None or getattr(info, "clamp", False):
        return _TYPERS
    if annotation is str:
        return value if type(value) is str and value.isascii() else _TYPERS
    if annotation is int:
        if type(value) is int:
            return _bounded(value, info)
        if type(value) is str and _INTEGER.fullmatch(value):
            return _bounded(int(value), info)
        return _TYPERS
    if annotation is float:
        if type(value) is float or type(value) is int:
            return _bounded(float(value), info)
        if type(value) is str and _DECIMAL.fullmatch(value):
            return _bounded(float(value), info)
        return _TYPERS
    if get_origin(annotation) is list and get_args(annotation) == (str,):
        # (a repeatable option: typer gives a list of its values)
        if type(value) in (tuple, list) and all(type(v) is str and v.isascii() for v in value):
            return list(value)
    return _TYPERS


class _PlainRuntime:
    """A parameter's conversion (typer's ``RuntimeParam`` interface): :func:`plain_value`,
    else typer's own (built on first need)."""

    def __init__(self, param: Any, typers: Any) -> None:
        self.param = param
        self.typers = typers
        descriptor = param.type_descriptor
        self.annotation = descriptor.annotation
        self.info = descriptor.parameter_info
        self.path = (descriptor.file_annotation is None and isinstance(self.annotation, type)
                     and issubclass(self.annotation, Path) and getattr(self.info, "path_type", None) is None)

    def coerce(self, value: Any, param: Any, ctx: Any) -> Any:
        if value is None:
            return () if param.multiple or param.nargs == -1 else None
        if self.path and type(value) is str and value and value.isascii():
            from typer._param_types import coerce_cli_path

            # (a Path already: typer's checks of it run, without its str-to-Path adapter)
            return coerce_cli_path(self.annotation(value), self.info, path_type=self.annotation, param=param, ctx=ctx)
        converted = plain_value(self.annotation, self.info, value) if not self.path else _TYPERS
        if converted is not _TYPERS:
            return converted
        return self.typers().coerce(value, param=param, ctx=ctx)


def plain_values(command: Any) -> None:
    """Give every typer parameter of ``command`` (a built click command or group, and its
    help option once made) the plain conversion, its own kept for what that declines. Where
    typer's parameters are not as this module knows them (another typer), nothing changes."""
    for sub in getattr(command, "commands", {}).values():  # (a group's commands)
        plain_values(sub)
    for param in getattr(command, "params", ()):
        plain_param(param)
    made = getattr(command, "get_help_option", None)
    if made is not None and "get_help_option" not in vars(command):
        def get_help_option(ctx: Any) -> Any:
            option = made(ctx)  # (typer makes it on first need, then keeps it)
            if option is not None:
                plain_param(option)
            return option

        command.get_help_option = get_help_option


def plain_param(param: Any) -> None:
    """Give ``param`` (a typer parameter) the plain conversion, once."""
    typers = getattr(type(param), "get_runtime_param", None)
    if typers is None or not hasattr(param, "type_descriptor") or "get_runtime_param" in vars(param):
        return
    runtime = _PlainRuntime(param, typers.__get__(param))
    param.get_runtime_param = lambda: runtime
