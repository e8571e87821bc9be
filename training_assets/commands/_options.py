"""CLI options derived from a library settings model, so a default and its help are declared once.

    add_model_options(parser, builders.GrpoConfig)          # --scale-rewards {group,none}, --min-pass-rate X, ...
    config = model_from_args(builders.GrpoConfig, args)     # only the options given; the model's defaults otherwise

Each field becomes ``--field-name``: a ``Literal`` offers its choices, a bool is
``--name/--no-name``, a list of strings takes ``a,b`` (or JSON), a dict or other list JSON. Options left out are not passed to the model, so
its own defaults apply; the help shows them. Values are validated by the model (one line naming
the option on a bad value).
"""

from __future__ import annotations

import argparse
import json
import types
import typing
from typing import Any, Literal, get_args, get_origin

from pydantic import BaseModel, ValidationError


def _dest(name: str) -> str:
    return f"opt__{name}"


def _string_list(text: str) -> list[str]:
    """``a,b`` or a JSON list (``[]`` for none)."""
    return json.loads(text) if text.strip().startswith("[") else [part for part in text.split(",") if part]


def _parser_type(annotation: Any) -> tuple[Any, list[Any] | None]:
    """(argparse type, choices) for a field's annotation (Optional[X] takes X's)."""
    origin = get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in get_args(annotation) if a is not type(None)]
        return _parser_type(inner[0]) if len(inner) == 1 else (str, None)
    if origin is Literal:
        choices = list(get_args(annotation))
        return type(choices[0]), choices
    if origin in (list, tuple) and get_args(annotation)[:1] == (str,):
        return _string_list, None
    if origin in (dict, list, tuple) or annotation in (dict, list, tuple):
        return json.loads, None
    if annotation in (int, float, str):
        return annotation, None
    return str, None


def add_model_options(parser: argparse.ArgumentParser, model: type[BaseModel]) -> None:
    """``--field-name`` for every field of ``model``, with its help and default shown."""
    for name, info in model.model_fields.items():
        flag = "--" + name.replace("_", "-")
        default = info.get_default(call_default_factory=True)
        help_text = f"{info.description or name} (default: {json.dumps(default) if not isinstance(default, str) else default})"
        if info.annotation is bool:
            parser.add_argument(flag, dest=_dest(name), action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS,
                                help=help_text)
            continue
        kind, choices = _parser_type(info.annotation)
        parser.add_argument(flag, dest=_dest(name), type=kind, choices=choices, default=argparse.SUPPRESS,
                            metavar=None if choices else "JSON" if kind is json.loads else "A,B" if kind is _string_list
                            else name.upper(), help=help_text)


def model_from_args(model: type[BaseModel], args: argparse.Namespace) -> BaseModel:
    """The model from the options given (``ValueError`` naming the first bad option)."""
    given = {name: getattr(args, _dest(name)) for name in model.model_fields if hasattr(args, _dest(name))}
    try:
        return model(**given)
    except ValidationError as exc:
        error = exc.errors()[0]
        name = str(error["loc"][0]) if error["loc"] else ""
        raise ValueError(f"--{name.replace('_', '-')}: {error['msg']}") from None
