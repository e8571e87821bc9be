"""The tools a served model calls: each one declaration (a typed function), its schema derived from it.

    execute("calculator", {"expression": "3*4"})       # ToolResult(content="12", error=None)
    execute("calculator", '{"expression": "2**9999"}')  # ToolResult(content="error: ...", error="...")
    tool_schemas(["calculator"])                        # the chat-completions ``tools`` list

A tool is a plain function whose annotated parameters are its input schema (the way the MCP SDK's
``@tool()`` works): ``@tool`` builds a pydantic model from the signature (extra keys refused), so the
schema the model sees and the validation its call gets cannot drift apart. Whatever goes wrong in a
call (an unknown tool, arguments that are not JSON or not valid, a tool that raises) becomes an
error result the model reads and the trace keeps; nothing escapes ``execute``.

Tool names are nouns-with-verbs that say the operation (``sort_list``, ``reverse_list``,
``count_items``...): the feasibility run saw a small model confuse a vague tool name with the
operation it was asked for.
"""

from __future__ import annotations

import ast
import inspect
import json
import math
import re
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, create_model

from training_assets.base_model.template import canonical_tool


class ToolFailure(ValueError):
    """A tool refused its input; the message is what the model reads."""


@dataclass(frozen=True)
class ToolResult:
    """What a call gave the model: ``content`` is the text it reads (``"error: ..."`` on failure)."""

    content: str
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    arguments: type[BaseModel]  # derived from the function's signature
    function: Callable[..., str]

    def schema(self) -> dict[str, Any]:
        """The chat-completions ``tools`` entry (titles dropped: they are tokens in every prompt)."""
        parameters = _without_titles(self.arguments.model_json_schema())
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": parameters}}


TOOLS: dict[str, Tool] = {}


def tool(description: str) -> Callable[[Callable[..., str]], Callable[..., str]]:
    """Register a function as a tool; its annotated parameters (and defaults) are the input schema."""

    def register(function: Callable[..., str]) -> Callable[..., str]:
        hints = typing.get_type_hints(function, include_extras=True)
        fields = {p.name: (hints[p.name], ... if p.default is inspect.Parameter.empty else p.default)
                  for p in inspect.signature(function).parameters.values()}
        model = create_model(f"{function.__name__}_arguments", __config__=ConfigDict(extra="forbid"), **fields)
        TOOLS[function.__name__] = Tool(function.__name__, description, model, function)
        return function

    return register


def _without_titles(schema: Any) -> Any:
    if isinstance(schema, dict):
        return {k: _without_titles(v) for k, v in schema.items() if k != "title"}
    if isinstance(schema, list):
        return [_without_titles(v) for v in schema]
    return schema


def tool_schemas(names: Sequence[str]) -> list[dict[str, Any]]:
    """The chat-completions ``tools`` list for ``names`` (in that order), each in its canonical key order
    (``template.canonical_tool``: training renders a trace's tools that way); an unknown name is a
    KeyError naming it."""
    unknown = [n for n in names if n not in TOOLS]
    if unknown:
        raise KeyError(f"unknown tool(s) {', '.join(map(repr, unknown))}; known: {', '.join(sorted(TOOLS))}")
    return [canonical_tool(TOOLS[name].schema()) for name in names]


def _one_line(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _failed(error: str) -> ToolResult:
    error = _one_line(error)
    return ToolResult(content=f"error: {error}", error=error)


def _validation_text(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors(include_url=False)[:3]:
        where = ".".join(str(p) for p in err["loc"])
        parts.append(f"{where}: {err['msg']}" if where else err["msg"])
    return "; ".join(parts)


def execute(name: str, arguments: str | dict[str, Any] | None) -> ToolResult:
    """Run tool ``name`` on ``arguments`` (a dict or JSON text); every failure is an error result, never raised."""
    known = TOOLS.get(name)
    if known is None:
        return _failed(f"unknown tool {name!r}; call one of: {', '.join(sorted(TOOLS))}")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError as exc:
            return _failed(f"arguments of {name} are not JSON ({exc}); send a JSON object")
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        return _failed(f"arguments of {name} must be a JSON object, not {type(arguments).__name__}")
    try:
        parsed = known.arguments.model_validate(arguments)
    except ValidationError as exc:
        required = ", ".join(known.arguments.model_fields)
        return _failed(f"bad arguments for {name}: {_validation_text(exc)}; it takes {required}")
    try:
        return ToolResult(content=known.function(**{k: getattr(parsed, k) for k in known.arguments.model_fields}))
    except (ToolFailure, ArithmeticError) as exc:
        return _failed(f"{name}: {exc}")
    except Exception as exc:  # a tool's bug is the attempt's failure, read by the model, not the harness's crash
        return _failed(f"{name} failed: {type(exc).__name__}: {exc}")


# --------------------------------------------------------------------------- numbers


def format_number(value: Fraction | int | float) -> str:
    """A number as an answer: whole numbers without a point, others to 12 significant digits.

    >>> format_number(Fraction(7, 4)), format_number(12.0), format_number(Fraction(1, 3))
    ('1.75', '12', '0.333333333333')
    """
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ToolFailure(f"the result is {value}")
        if value.is_integer() and abs(value) < 1e15:
            return str(int(value))
        value = Fraction(value)
    value = Fraction(value)
    if value.denominator == 1:
        return str(value.numerator)
    text = f"{float(value):.12g}"
    return "0" if text in ("-0", "0") else text


# --------------------------------------------------------------------------- calculator

MAX_EXPRESSION_CHARS = 300
MAX_EXPRESSION_NODES = 120
MAX_EXPONENT = 128  # |exponent| of **
MAX_RESULT_BITS = 512  # numerator/denominator of every intermediate value (about 154 decimal digits)

_BINARY = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
           ast.Div: lambda a, b: a / b, ast.FloorDiv: lambda a, b: Fraction(a // b), ast.Mod: lambda a, b: a % b}
_SYMBOLS = {"×": "*", "÷": "/", "−": "-", "–": "-"}


def _bounded(value: Fraction) -> Fraction:
    if max(value.numerator.bit_length(), value.denominator.bit_length()) > MAX_RESULT_BITS:
        raise ToolFailure(f"a value in the expression is too large (more than {MAX_RESULT_BITS} bits)")
    return value


def _power(base: Fraction, exponent: Fraction) -> Fraction:
    if exponent.denominator != 1:
        raise ToolFailure("only whole-number exponents are supported")
    if abs(exponent) > MAX_EXPONENT:
        raise ToolFailure(f"exponent {exponent} is too large (at most {MAX_EXPONENT})")
    size = max(base.numerator.bit_length(), base.denominator.bit_length())
    if size * abs(int(exponent)) > MAX_RESULT_BITS + 1:  # refuse before computing, not after
        raise ToolFailure(f"the power is too large (more than {MAX_RESULT_BITS} bits)")
    if base == 0 and exponent < 0:
        raise ToolFailure("zero cannot be raised to a negative power")
    return base ** int(exponent)


def _evaluate(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        if isinstance(node.value, float) and not math.isfinite(node.value):
            raise ToolFailure("numbers must be finite")
        return _bounded(Fraction(str(node.value)) if isinstance(node.value, float) else Fraction(node.value))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        operand = _evaluate(node.operand)
        return -operand if isinstance(node.op, ast.USub) else operand
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
        return _bounded(_power(_evaluate(node.left), _evaluate(node.right)))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if right == 0 and isinstance(node.op, ast.Div | ast.FloorDiv | ast.Mod):
            raise ToolFailure("division by zero")
        return _bounded(_BINARY[type(node.op)](left, right))
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitXor):
        raise ToolFailure("'^' is not a power here: write ** (2**3)")
    raise ToolFailure(f"{type(node).__name__} is not allowed: only numbers, + - * / // % ** and parentheses")


def evaluate_expression(expression: str) -> Fraction:
    """The exact value of an arithmetic expression, parsed with ``ast`` and walked; never ``eval``.

    >>> evaluate_expression("(2 + 3) * -4 ** 2 // 3")
    Fraction(-27, 1)
    """
    text = expression.strip()
    for symbol, ascii_symbol in _SYMBOLS.items():
        text = text.replace(symbol, ascii_symbol)
    if not text:
        raise ToolFailure("the expression is empty")
    if len(text) > MAX_EXPRESSION_CHARS:
        raise ToolFailure(f"the expression is longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError) as exc:
        raise ToolFailure(f"cannot parse {_one_line(text, 80)!r} ({getattr(exc, 'msg', exc)})") from None
    if sum(1 for _ in ast.walk(tree)) > MAX_EXPRESSION_NODES:
        raise ToolFailure(f"the expression has more than {MAX_EXPRESSION_NODES} parts")
    return _evaluate(tree)


@tool("Evaluate an arithmetic expression (numbers, + - * / // % ** and parentheses) and return its value.")
def calculator(expression: Annotated[str, Field(description="The expression, e.g. (12 + 3) * 4")]) -> str:
    return format_number(evaluate_expression(expression))


# --------------------------------------------------------------------------- units

# unit -> (dimension, factor to the dimension's base unit); temperature is affine, handled apart
UNITS: dict[str, tuple[str, Fraction]] = {
    "mm": ("length", Fraction(1, 1000)), "cm": ("length", Fraction(1, 100)), "m": ("length", Fraction(1)),
    "km": ("length", Fraction(1000)), "in": ("length", Fraction("0.0254")), "ft": ("length", Fraction("0.3048")),
    "yd": ("length", Fraction("0.9144")), "mi": ("length", Fraction("1609.344")),
    "mg": ("mass", Fraction(1, 10**6)), "g": ("mass", Fraction(1, 1000)), "kg": ("mass", Fraction(1)),
    "t": ("mass", Fraction(1000)), "oz": ("mass", Fraction("0.028349523125")), "lb": ("mass", Fraction("0.45359237")),
    "ms": ("time", Fraction(1, 1000)), "s": ("time", Fraction(1)), "min": ("time", Fraction(60)),
    "h": ("time", Fraction(3600)), "day": ("time", Fraction(86400)), "week": ("time", Fraction(604800)),
    "ml": ("volume", Fraction(1, 1000)), "l": ("volume", Fraction(1)), "gal": ("volume", Fraction("3.785411784")),
    "cup": ("volume", Fraction("0.2365882365")),
    "C": ("temperature", Fraction(1)), "F": ("temperature", Fraction(1)), "K": ("temperature", Fraction(1)),
}
UNIT_ALIASES: dict[str, tuple[str, ...]] = {
    "mm": ("millimeter", "millimeters", "millimetre", "millimetres"),
    "cm": ("centimeter", "centimeters", "centimetre", "centimetres"),
    "m": ("meter", "meters", "metre", "metres"),
    "km": ("kilometer", "kilometers", "kilometre", "kilometres"),
    "in": ("inch", "inches"), "ft": ("foot", "feet"), "yd": ("yard", "yards"), "mi": ("mile", "miles"),
    "mg": ("milligram", "milligrams"), "g": ("gram", "grams"), "kg": ("kilogram", "kilograms"),
    "t": ("tonne", "tonnes"), "oz": ("ounce", "ounces"), "lb": ("pound", "pounds", "lbs"),
    "ms": ("millisecond", "milliseconds"), "s": ("second", "seconds", "sec"), "min": ("minute", "minutes"),
    "h": ("hour", "hours", "hr"), "day": ("days",), "week": ("weeks",),
    "ml": ("milliliter", "milliliters", "millilitre", "millilitres"),
    "l": ("liter", "liters", "litre", "litres"), "gal": ("gallon", "gallons"), "cup": ("cups",),
    "C": ("celsius", "°c", "degrees celsius"), "F": ("fahrenheit", "°f", "degrees fahrenheit"),
    "K": ("kelvin", "kelvins"),
}
_UNIT_LOOKUP = {name.lower(): unit for unit, names in UNIT_ALIASES.items() for name in (unit, *names)}
UNIT_DECIMALS = 4  # conversions are answered rounded to this many decimal places


def canonical_unit(name: str) -> str:
    """The table's name for ``name`` (any alias, any case); a ToolFailure listing the units otherwise."""
    unit = _UNIT_LOOKUP.get(" ".join(str(name).lower().split()))
    if unit is None:
        raise ToolFailure(f"unknown unit {name!r}; use one of: {', '.join(UNITS)}")
    return unit


def unit_names(unit: str) -> list[str]:
    """Every spelling of ``unit`` an answer may carry (its table name first)."""
    unit = canonical_unit(unit)
    return [unit, *UNIT_ALIASES[unit]]


def _to_kelvin(value: Fraction, unit: str) -> Fraction:
    return {"K": value, "C": value + Fraction("273.15"), "F": (value - 32) * Fraction(5, 9) + Fraction("273.15")}[unit]


def _from_kelvin(value: Fraction, unit: str) -> Fraction:
    return {"K": value, "C": value - Fraction("273.15"), "F": (value - Fraction("273.15")) * Fraction(9, 5) + 32}[unit]


def convert(value: Fraction | float | int, from_unit: str, to_unit: str) -> Fraction:
    """The exact conversion of ``value`` between two units of one dimension (the fixed table)."""
    source, target = canonical_unit(from_unit), canonical_unit(to_unit)
    (dim_from, factor_from), (dim_to, factor_to) = UNITS[source], UNITS[target]
    if dim_from != dim_to:
        raise ToolFailure(f"cannot convert {source} ({dim_from}) to {target} ({dim_to})")
    value = Fraction(str(value)) if isinstance(value, float) else Fraction(value)
    if dim_from == "temperature":
        return _from_kelvin(_to_kelvin(value, source), target)
    return value * factor_from / factor_to


@tool("Convert a value between units of length, mass, time, temperature or volume.")
def convert_units(value: Annotated[float, Field(description="The number to convert")],
                  from_unit: Annotated[str, Field(description="Unit of the value, e.g. km, lb, F, l")],
                  to_unit: Annotated[str, Field(description="Unit to convert to")]) -> str:
    if not math.isfinite(value) or abs(value) > 1e15:
        raise ToolFailure("value must be a finite number below 1e15 in size")
    return format_number(round(convert(value, from_unit, to_unit), UNIT_DECIMALS))


# --------------------------------------------------------------------------- lists

MAX_ITEMS = 200
_NUMBER = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$")


def _as_text(item: Any) -> Any:
    if isinstance(item, bool):  # JSON true/false are not list items a task means
        raise ValueError("items are words or numbers, not true/false")
    if isinstance(item, int | float):
        return format_number(item)
    return item.strip() if isinstance(item, str) else item


Item = Annotated[str, BeforeValidator(_as_text)]
Items = Annotated[list[Item], Field(max_length=MAX_ITEMS, description="The list items, e.g. [\"pear\", \"fig\"]")]


def _numeric(items: Sequence[str]) -> bool:
    return bool(items) and all(_NUMBER.match(item) for item in items)


def _order_key(items: Sequence[str]) -> Callable[[str], Any]:
    """Numbers by value when every item is a number, words alphabetically (case-insensitive) otherwise."""
    return (lambda item: Fraction(item)) if _numeric(items) else (lambda item: (item.casefold(), item))


def _listed(items: Sequence[str]) -> str:
    return ", ".join(items)


@tool("Sort list items: numbers by value, words alphabetically.")
def sort_list(items: Items, order: Annotated[Literal["ascending", "descending"],
                                             Field(description="ascending or descending")] = "ascending") -> str:
    return _listed(sorted(items, key=_order_key(items), reverse=order == "descending"))


@tool("Reverse the order of list items.")
def reverse_list(items: Items) -> str:
    return _listed(items[::-1])


@tool("Count how many items a list has.")
def count_items(items: Items) -> str:
    return str(len(items))


@tool("Remove repeated items from a list, keeping the first of each.")
def unique_items(items: Items) -> str:
    return _listed(list(dict.fromkeys(items)))


@tool("Return the largest item: the biggest number, or the last word alphabetically.")
def max_item(items: Items) -> str:
    if not items:
        raise ToolFailure("the list is empty")
    return max(items, key=_order_key(items))


@tool("Return the smallest item: the smallest number, or the first word alphabetically.")
def min_item(items: Items) -> str:
    if not items:
        raise ToolFailure("the list is empty")
    return min(items, key=_order_key(items))


@tool("Join list items into one text with a separator between them.")
def join_items(items: Items, separator: Annotated[str, Field(max_length=10, description="Text between items, e.g. -")]) -> str:
    return separator.join(items)
