"""Task files refuse bad lines in one line; the calculator never evaluates code; conversions and strict scoring."""

import json

import pytest

from training_assets.harness.scoring import score
from training_assets.harness.tasks import TaskFileError, load_tasks
from training_assets.harness.tools import execute, tool_schemas

GOOD = {"task_id": "t1", "family": "calculator", "prompt": "What is 2 + 2?", "tools": ["calculator"],
        "expected_answer": "4"}


def _write(tmp_path, lines):
    path = tmp_path / "tasks.jsonl"
    path.write_text("\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines) + "\n")
    return path


def test_a_good_task_file_loads_in_order(tmp_path):
    path = _write(tmp_path, [GOOD, "", {**GOOD, "task_id": "t2", "metadata": {"answer_units": ["km"]}}])
    tasks = load_tasks(path)
    assert [t.task_id for t in tasks] == ["t1", "t2"] and tasks[1].answer_units == ["km"]


@pytest.mark.parametrize("bad_line, line_no, problem, fix", [
    ('{"task_id": "t2", "family": ', 2, "not JSON", "one JSON object per line"),
    ({**GOOD, "task_id": "t2", "tools": ["calculator", "web_search"]}, 2, "unknown tool 'web_search'",
     "use tools from the registry: calculator, convert_units"),
    (GOOD, 2, "task_id 't1' is already used on line 1", "unique task_id"),
    ({k: v for k, v in GOOD.items() if k != "expected_answer"} | {"task_id": "t2"}, 2, "expected_answer is missing",
     "every task needs"),
    ({**GOOD, "task_id": "t2", "expected_answer": 4}, 2, "field expected_answer", "strings"),
    ({**GOOD, "task_id": "t2", "answer": "4"}, 2, "unknown field answer", "metadata"),
])
def test_a_bad_line_is_one_line_naming_the_file_the_line_and_the_fix(tmp_path, bad_line, line_no, problem, fix):
    path = _write(tmp_path, [GOOD, bad_line])
    with pytest.raises(TaskFileError) as raised:
        load_tasks(path)
    message = str(raised.value)
    assert message.startswith(f"{path}:{line_no}: ") and problem in message and fix in message, message
    assert "\n" not in message and message.index(problem) < message.index(";") < message.index(fix)


def test_a_missing_or_empty_task_file_is_a_task_file_error(tmp_path):
    with pytest.raises(TaskFileError, match="cannot read the task file"):
        load_tasks(tmp_path / "absent.jsonl")
    with pytest.raises(TaskFileError, match="holds no tasks"):
        load_tasks(_write(tmp_path, [""]))


@pytest.mark.parametrize("expression, value", [
    ("3*4", "12"), ("(2 + 3) * -4 ** 2 // 3", "-27"), ("7 / 4", "1.75"), ("0.1 + 0.2", "0.3"), ("-7 % 3", "2"),
    ("2 ** -2", "0.25"), ("12 × 3 − 1", "35"), ("1 / 3", "0.333333333333"),
])
def test_the_calculator_computes_exactly(expression, value):
    assert execute("calculator", {"expression": expression}).content == value


@pytest.mark.parametrize("expression, why", [
    ("__import__('os').system('true')", "Call is not allowed"),
    ("().__class__.__bases__", "Attribute is not allowed"),
    ("x + 1", "Name is not allowed"),
    ("'a' * 3", "Constant is not allowed"),
    ("[1, 2]", "List is not allowed"),
    ("lambda: 1", "Lambda is not allowed"),
    ("2 ** 10000", "exponent 10000 is too large"),
    ("9 ** 9 ** 9", "too large"),
    ("(10 ** 100) ** 100", "too large"),
    ("1 / 0", "division by zero"),
    ("2 ^ 3", "write **"),
    ("1 +", "cannot parse"),
    ("1" + " + 1" * 200, "longer than"),
])
def test_the_calculator_refuses_anything_but_bounded_arithmetic(expression, why):
    result = execute("calculator", {"expression": expression})
    assert result.error is not None and why in result.error and result.content == f"error: {result.error}"


@pytest.mark.parametrize("value, source, target, expected", [
    (5, "km", "mi", "3.1069"), (100, "C", "F", "212"), (-40, "F", "C", "-40"), (0, "C", "K", "273.15"),
    (2, "lb", "kg", "0.9072"), (90, "min", "h", "1.5"), (1, "gal", "l", "3.7854"), (3, "feet", "Inches", "36"),
    (1.5, "kilograms", "g", "1500"),
])
def test_unit_conversions_use_the_fixed_table(value, source, target, expected):
    assert execute("convert_units", {"value": value, "from_unit": source, "to_unit": target}).content == expected


def test_bad_tool_calls_are_error_results_the_model_reads():
    cases = [
        ("convert_units", '{"value": 1, "from_unit": "kg", "to_unit": "km"}', "cannot convert kg (mass) to km (length)"),
        ("convert_units", {"value": 1, "from_unit": "parsec", "to_unit": "km"}, "unknown unit 'parsec'"),
        ("sort_list", "{not json", "arguments of sort_list are not JSON"),
        ("sort_list", {"items": ["a"], "order": "upwards"}, "order: Input should be 'ascending' or 'descending'"),
        ("join_items", {"items": ["a"], "separator": "-", "extra": 1}, "extra: Extra inputs are not permitted"),
        ("max_item", {"items": []}, "the list is empty"),
        ("calculate", {"expression": "1"}, "unknown tool 'calculate'; call one of: calculator"),
        ("count_items", [1, 2], "must be a JSON object"),
    ]
    for name, arguments, why in cases:
        result = execute(name, arguments)
        assert result.error and why in result.error, (name, result)


def test_list_tools_sort_numbers_by_value_and_words_alphabetically():
    assert execute("sort_list", {"items": [10, "9", 100], "order": "descending"}).content == "100, 10, 9"
    assert execute("sort_list", {"items": ["pear", "Apple", "fig"]}).content == "Apple, fig, pear"
    assert execute("unique_items", {"items": ["a", "b", "a", "c", "b"]}).content == "a, b, c"
    assert execute("max_item", {"items": ["9", "10", "2"]}).content == "10"
    assert execute("min_item", {"items": ["pear", "fig"]}).content == "fig"
    assert execute("join_items", {"items": ["a", "b"], "separator": "-"}).content == "a-b"
    assert execute("reverse_list", {"items": ["a", "b", "c"]}).content == "c, b, a"
    assert execute("count_items", {"items": ["a", "a"]}).content == "2"


def test_tool_schemas_are_chat_completions_tools_derived_from_the_signatures():
    [schema] = tool_schemas(["sort_list"])
    assert schema["type"] == "function" and schema["function"]["name"] == "sort_list"
    parameters = schema["function"]["parameters"]
    assert parameters["required"] == ["items"] and parameters["properties"]["order"]["enum"] == ["ascending", "descending"]
    assert "title" not in json.dumps(schema)
    with pytest.raises(KeyError, match="unknown tool"):
        tool_schemas(["nope"])


@pytest.mark.parametrize("answer, expected, units, ok", [
    ("3", "53 - 50", (), False),  # never a substring
    ("53", "3", (), False),
    ("The answer is 12", "12", (), False),  # the whole answer must be the number
    ("12.", "12", (), True),
    (" 12.0 ", "12", (), True),
    ("1,250", "1250", (), True),
    ("12.0000001", "12", (), True),  # within 1e-6 relative
    ("12.0001", "12", (), False),
    ("3.1069 miles", "3.1069", ("mi", "mile", "miles"), True),
    ("3.1069mi", "3.1069", ("mi",), True),
    ("3.1069 km", "3.1069", ("mi", "miles"), False),  # only the task's unit
    ("apple, Fig,  pear", "apple, fig, pear", (), True),
    ("apple, pear, fig", "apple, fig, pear", (), False),  # order matters
    ("apple, fig", "apple, fig, pear", (), False),
    ('["apple", "fig"]', "apple, fig", (), True),
    ("10, 9.0, 2", "10, 9, 2", (), True),
    ("A-B-C.", "a-b-c", (), True),
    ("a-b-c-d", "a-b-c", (), False),
    ("", "0", (), False),
    (None, "0", (), False),
])
def test_scoring_is_strict(answer, expected, units, ok):
    assert score(answer, expected, units=units) is ok
