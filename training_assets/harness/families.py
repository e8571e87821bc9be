"""The built-in task families (calculator, units, lists) and the two committed pools made from them.

    python -m training_assets.harness.families --write   # regenerate both files (seeded, deterministic)
    python -m training_assets.harness.families --check   # exit 1 when the committed files differ

``agentic_train.jsonl`` is the training pool (the loop collects traces on it);
``agentic_held_out.jsonl`` is never trained on: its phrasing templates are a disjoint set (more
of them, more list operations and two-step list tasks), its list words come from another
vocabulary, and no held-out prompt shares a word 8-gram with a training prompt (checked here
before anything is written, and by the tests). Every task carries ``metadata.calls``, the ideal
tool calls, so ``teacher`` can replay them; the expected answer is what those calls return.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from training_assets.harness.tasks import Task
from training_assets.harness.tools import execute, unit_names
from training_assets.storage import write_bytes_atomic

DATA_DIR = Path(__file__).resolve().parents[1] / "eval_tasks" / "data"
TRAIN_TASKS = DATA_DIR / "agentic_train.jsonl"
HELD_OUT_TASKS = DATA_DIR / "agentic_held_out.jsonl"
SEED = 20261204
# tasks per family in each pool: the held-out pool leans on lists, the weakest family of the feasibility run
POOL_SIZES = {"train": {"calculator": 100, "units": 100, "lists": 100},
              "held_out": {"calculator": 40, "units": 40, "lists": 60}}
DECONTAMINATION_NGRAM = 8

Call = dict[str, Any]
# a generated task before its answer: (prompt, ideal calls, answer units)
Draft = tuple[str, list[Call], list[str]]

# --------------------------------------------------------------------------- phrasings (disjoint per pool)

CALC_TEMPLATES = {
    "train": ["What is {expr}?", "Calculate {expr}.", "Compute {expr}.", "Evaluate the expression {expr}.",
              "Use the calculator to work out {expr}.", "Find the value of {expr}."],
    "held_out": ["I need the result of {expr}, please.", "How much is {expr}?", "Could you tell me what {expr} equals?",
                 "Work this out for me: {expr}", "{expr} = ? Reply with the number only.",
                 "My homework asks for {expr}. What do I write down?", "Give me the value you get from {expr}.",
                 "Quick check, what does {expr} come to?"],
}
# binary operations said in words: (phrase, operator)
CALC_WORDS = {
    "train": [("the product of {a} and {b}", "*"), ("the sum of {a} and {b}", "+"), ("{a} minus {b}", "-"),
              ("{a} divided by {b}", "/")],
    "held_out": [("{a} times {b}", "*"), ("{a} added to {b}", "+"), ("{b} subtracted from {a}", "-"),
                 ("{a} shared equally into {b} parts", "/")],
}

UNITS_TEMPLATES = {
    "train": ["Convert {v} {src} to {dst}.", "How many {dst} are in {v} {src}?", "Express {v} {src} in {dst}.",
              "What is {v} {src} in {dst}?"],
    "held_out": ["I have {v} {src}. How much is that in {dst}?", "Change {v} {src} into {dst}, please.",
                 "A note says {v} {src}; what is that in {dst}?", "Tell me the {dst} equivalent of {v} {src}.",
                 "If something measures {v} {src}, how many {dst} is it?", "Turn {v} {src} into {dst} for me."],
}
# unit -> how prompts name it
UNIT_WORDS = {"mm": "millimeters", "cm": "centimeters", "m": "meters", "km": "kilometers", "in": "inches",
              "ft": "feet", "yd": "yards", "mi": "miles", "mg": "milligrams", "g": "grams", "kg": "kilograms",
              "t": "tonnes", "oz": "ounces", "lb": "pounds", "ms": "milliseconds", "s": "seconds", "min": "minutes",
              "h": "hours", "day": "days", "week": "weeks", "ml": "milliliters", "l": "liters", "gal": "gallons",
              "cup": "cups", "C": "degrees Celsius", "F": "degrees Fahrenheit", "K": "kelvin"}
UNIT_PAIRS = [("km", "mi"), ("mi", "km"), ("m", "ft"), ("ft", "m"), ("cm", "in"), ("in", "cm"), ("m", "cm"),
              ("km", "m"), ("yd", "m"), ("mm", "cm"), ("kg", "lb"), ("lb", "kg"), ("g", "oz"), ("oz", "g"),
              ("kg", "g"), ("t", "kg"), ("mg", "g"), ("h", "min"), ("min", "s"), ("day", "h"), ("week", "day"),
              ("s", "ms"), ("h", "s"), ("l", "ml"), ("ml", "l"), ("gal", "l"), ("l", "gal"), ("cup", "ml"),
              ("C", "F"), ("F", "C"), ("C", "K"), ("K", "C")]

# list operation -> templates per pool ({items} the list as text, {sep} the separator in words)
LIST_TEMPLATES: dict[str, dict[str, list[str]]] = {
    "sort_words_asc": {"train": ["Sort these words alphabetically: {items}"],
                       "held_out": ["Arrange the following from A to Z: {items}", "Can you alphabetize this: {items}"]},
    "sort_words_desc": {"train": ["Sort these words from Z to A: {items}"],
                        "held_out": ["List these in reverse alphabetical order: {items}"]},
    "sort_numbers_asc": {"train": ["Put these numbers in ascending order: {items}"],
                         "held_out": ["Order these smallest to largest, please: {items}"]},
    "sort_numbers_desc": {"train": ["Sort these numbers in descending order: {items}"],
                          "held_out": ["Rank these from biggest down to smallest: {items}"]},
    "reverse": {"train": ["Reverse the order of this list: {items}", "Write this list backwards: {items}"],
                "held_out": ["Flip the sequence so the last comes first: {items}",
                             "Starting from the end, give me these items: {items}"]},
    "count": {"train": ["How many items are in this list: {items}?"],
              "held_out": ["Tell me the number of entries here: {items}", "Count the elements of {items}"]},
    "unique": {"train": ["Remove the duplicates from this list: {items}"],
               "held_out": ["Drop any repeated entries, keeping first appearances: {items}",
                            "Which distinct entries appear, in order of first use? {items}"]},
    "max": {"train": ["What is the largest number in this list: {items}?"],
            "held_out": ["Pick out the biggest value among {items}", "Of {items}, which one is the highest?"]},
    "min": {"train": ["What is the smallest number in this list: {items}?"],
            "held_out": ["Which value is the lowest among {items}?", "Find the minimum of these numbers: {items}"]},
    "join": {"train": ["Join these words with {sep}: {items}"],
             "held_out": ["Glue these entries together using {sep} between them: {items}",
                          "Combine {items} into one string separated by {sep}."]},
    "sort_join": {"train": ["Sort these words alphabetically, then join them with {sep}: {items}"],
                  "held_out": ["Alphabetize {items} and then connect them with {sep} in between."]},
    "unique_count": {"train": ["How many different words are in this list: {items}?"],
                     "held_out": ["Ignoring repeats, how many separate entries does this contain: {items}"]},
}
SEPARATORS = {"-": "a hyphen", "/": "a slash", "_": "an underscore", " ": "a space", ";": "a semicolon",
              "+": "a plus sign"}
# list words: the held-out pool draws from a vocabulary the training pool never shows
WORDS = {
    "train": ["apple", "pear", "fig", "plum", "mango", "kiwi", "lemon", "grape", "peach", "cherry", "melon",
              "lime", "cat", "dog", "horse", "zebra", "otter", "eagle", "tiger", "camel", "red", "blue", "green",
              "amber", "violet"],
    "held_out": ["oslo", "lima", "cairo", "dublin", "quito", "paris", "rome", "tokyo", "hammer", "wrench", "chisel",
                 "saw", "drill", "pliers", "piano", "violin", "flute", "cello", "harp", "banjo", "copper", "silver",
                 "nickel", "cobalt", "zinc"],
}


# --------------------------------------------------------------------------- generators


def _calc_draft(rng: random.Random, pool: str, index: int) -> Draft:
    if index % 4 == 3:  # every fourth task says its operation in words
        phrase, op = rng.choice(CALC_WORDS[pool])
        b = rng.choice([2, 4, 5, 8, 10]) if op == "/" else rng.randint(2, 99)
        a = b * rng.randint(2, 60) if op == "/" else rng.randint(2, 999)
        spoken = phrase.format(a=a, b=b)
        expression = f"{b} + {a}" if phrase.startswith("{a} added to") else f"{a} {op} {b}"
        template = CALC_TEMPLATES[pool][index % len(CALC_TEMPLATES[pool])]
        return template.format(expr=spoken), [{"name": "calculator", "arguments": {"expression": expression}}], []
    a, b, c = rng.randint(2, 99), rng.randint(2, 99), rng.randint(2, 30)
    shapes = [f"{a} + {b} * {c}", f"({a} - {b}) * {c}", f"{a} * {b} - {c}", f"{a * c} / {c}", f"{c} ** 2 + {a}",
              f"{a * b + c} % {b}", f"{a * b + c} // {b}", f"-{a} + {b} * {c}", f"{a} * ({b} + {c})",
              f"{a}.5 * {c % 8 + 2}", f"{a} - {b} - {c}", f"({a} + {b}) / {rng.choice([2, 4, 5, 8])}"]
    expression = rng.choice(shapes)
    template = CALC_TEMPLATES[pool][index % len(CALC_TEMPLATES[pool])]
    return template.format(expr=expression), [{"name": "calculator", "arguments": {"expression": expression}}], []


def _units_draft(rng: random.Random, pool: str, index: int) -> Draft:
    src, dst = rng.choice(UNIT_PAIRS)
    value: int | float = rng.randint(1, 500) if rng.random() < 0.7 else rng.randint(10, 2000) / 10
    if src in ("C", "F"):
        value = rng.randint(-40, 220)
    template = UNITS_TEMPLATES[pool][index % len(UNITS_TEMPLATES[pool])]
    prompt = template.format(v=value, src=UNIT_WORDS[src], dst=UNIT_WORDS[dst])
    call = {"name": "convert_units", "arguments": {"value": value, "from_unit": src, "to_unit": dst}}
    return prompt, [call], unit_names(dst)


def _list_items(rng: random.Random, pool: str, operation: str) -> list[str]:
    size = rng.randint(3, 7)
    if operation in ("max", "min", "sort_numbers_asc", "sort_numbers_desc"):
        return [str(n) for n in rng.sample(range(1, 1000), size)]
    if operation in ("unique", "unique_count"):
        distinct = rng.sample(WORDS[pool], size)
        items = distinct + [rng.choice(distinct) for _ in range(rng.randint(1, 3))]
        rng.shuffle(items)
        return items
    return rng.sample(WORDS[pool], size)


def _list_calls(operation: str, items: list[str], separator: str) -> list[Call]:
    if operation == "sort_join":
        ordered = execute("sort_list", {"items": items, "order": "ascending"}).content.split(", ")
        return [{"name": "sort_list", "arguments": {"items": items, "order": "ascending"}},
                {"name": "join_items", "arguments": {"items": ordered, "separator": separator}}]
    if operation == "unique_count":
        distinct = execute("unique_items", {"items": items}).content.split(", ")
        return [{"name": "unique_items", "arguments": {"items": items}},
                {"name": "count_items", "arguments": {"items": distinct}}]
    ascending, descending = ("sort_list", {"order": "ascending"}), ("sort_list", {"order": "descending"})
    name, extra = {"sort_words_asc": ascending, "sort_numbers_asc": ascending,
                   "sort_words_desc": descending, "sort_numbers_desc": descending,
                   "reverse": ("reverse_list", {}), "count": ("count_items", {}), "unique": ("unique_items", {}),
                   "max": ("max_item", {}), "min": ("min_item", {}),
                   "join": ("join_items", {"separator": separator})}[operation]
    return [{"name": name, "arguments": {"items": items, **extra}}]


def _lists_draft(rng: random.Random, pool: str, index: int) -> Draft:
    operations = list(LIST_TEMPLATES)
    operation = operations[index % len(operations)]
    templates = LIST_TEMPLATES[operation][pool]
    template = templates[(index // len(operations)) % len(templates)]
    items = _list_items(rng, pool, operation)
    separator = rng.choice(list(SEPARATORS))
    prompt = template.format(items=", ".join(items), sep=SEPARATORS[separator])
    return prompt, _list_calls(operation, items, separator), []


FAMILIES: dict[str, tuple[str, list[str], Callable[[random.Random, str, int], Draft]]] = {
    # family -> (task id prefix, tools offered, generator)
    "calculator": ("calc", ["calculator"], _calc_draft),
    "units": ("units", ["convert_units"], _units_draft),
    "lists": ("lists", ["sort_list", "reverse_list", "count_items", "unique_items", "max_item", "min_item",
                        "join_items"], _lists_draft),
}


def _answer(calls: list[Call]) -> str:
    """What the last of the ideal calls returns, run for real; a failing call is a generator bug."""
    result = None
    for call in calls:
        result = execute(call["name"], call["arguments"])
        if result.error:
            raise RuntimeError(f"generated call {call} failed: {result.error}")
    if result is None:
        raise RuntimeError("a generated task has no calls")
    return result.content


def build_pool(pool: str, seed: int = SEED) -> list[Task]:
    """The ``pool`` ("train" or "held_out") tasks, the same for the same seed."""
    tasks: list[Task] = []
    for family, count in POOL_SIZES[pool].items():
        prefix, tools, draft = FAMILIES[family]
        rng = random.Random(f"{seed}:{pool}:{family}")
        seen: set[str] = set()
        index = 0
        while len(seen) < count:
            prompt, calls, units = draft(rng, pool, index)
            index += 1
            if prompt in seen:
                continue
            seen.add(prompt)
            metadata: dict[str, Any] = {"calls": calls, "pool": pool}
            if units:
                metadata["answer_units"] = units
            tasks.append(Task(task_id=f"{pool}-{prefix}-{len(seen):04d}", family=family, prompt=prompt, tools=tools,
                              expected_answer=_answer(calls), metadata=metadata))
    return tasks


def word_ngrams(text: str, n: int = DECONTAMINATION_NGRAM) -> set[tuple[str, ...]]:
    words = re.findall(r"\w+", text.lower())
    return {tuple(words[i:i + n]) for i in range(len(words) - n + 1)}


def shared_ngrams(train: Iterable[str], held_out: Iterable[str], n: int = DECONTAMINATION_NGRAM) -> dict[str, list[str]]:
    """Held-out prompts that share a word ``n``-gram with a training prompt -> the shared n-grams."""
    seen = set().union(*(word_ngrams(p, n) for p in train))
    out = {}
    for prompt in held_out:
        shared = word_ngrams(prompt, n) & seen
        if shared:
            out[prompt] = sorted(" ".join(g) for g in shared)
    return out


def render(tasks: Sequence[Task]) -> bytes:
    return "".join(json.dumps(t.model_dump(), sort_keys=True, ensure_ascii=False) + "\n" for t in tasks).encode()


def pool_files(seed: int = SEED) -> dict[Path, bytes]:
    """Both pools as the bytes of their files; refuses pools that are contaminated or share a task id."""
    train, held_out = build_pool("train", seed), build_pool("held_out", seed)
    contaminated = shared_ngrams([t.prompt for t in train], [t.prompt for t in held_out])
    if contaminated:
        prompt, grams = next(iter(contaminated.items()))
        raise RuntimeError(f"{len(contaminated)} held-out prompt(s) share a word {DECONTAMINATION_NGRAM}-gram with the "
                           f"training pool, e.g. {prompt!r} ({grams[0]!r}); change the templates")
    collide = {t.task_id for t in train} & {t.task_id for t in held_out}
    if collide:
        raise RuntimeError(f"task ids in both pools: {sorted(collide)[:5]}")
    return {TRAIN_TASKS: render(train), HELD_OUT_TASKS: render(held_out)}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training_assets.harness.families", description=__doc__.split("\n\n")[0])
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--write", action="store_true", help="write both pool files (atomically)")
    action.add_argument("--check", action="store_true", help="exit 1 when a committed pool file differs")
    parser.add_argument("--seed", type=int, default=SEED, help="generator seed (the committed files use the default)")
    args = parser.parse_args(argv)
    stale = []
    for path, data in pool_files(args.seed).items():
        if args.write:
            write_bytes_atomic(path, data)
            print(f"wrote {path} ({len(data.splitlines())} tasks)")
        elif not path.is_file() or path.read_bytes() != data:
            stale.append(str(path))
    if stale:
        print(f"out of date: {', '.join(stale)}; run python -m training_assets.harness.families --write",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
