"""normalize and every quality-filter drop reason."""

import pytest

from training_assets.data_engine import QualityConfig, normalize, quality_filter

PROSE = ("The committee met on Tuesday to review the budget for the coming year. Members asked for "
         "clearer estimates of travel costs and agreed to publish the minutes within a week.")


def test_normalize_nfc_whitespace_and_control_characters():
    text = "Cafe\u0301\u00a0 au\tlait\x00\x07\r\n\r\n\r\n\r\nsecond  line  \u2003end "
    assert normalize(text) == "Caf\u00e9 au lait\n\nsecond line end"
    assert normalize(normalize(text)) == normalize(text)


def _reason(text, **cfg):
    kept, dropped = quality_filter([{"id": "r", "text": text}], QualityConfig(**cfg))
    return dropped[0].reason if dropped else None


@pytest.mark.parametrize("text, cfg, reason", [
    ("too short", {}, "too_short"),
    (PROSE * 3, {"max_chars": 100}, "too_long"),
    ("$$ %% ^^ && ** (( )) {{ }} [[ ]] ;; :: <> ?? !! @@ ~~ ``", {}, "low_alnum_ratio"),
    ("# heading # more # tags # here # and # more # hashes # everywhere", {}, "high_symbol_ratio"),
    ("same line here\n" * 6 + "one different line", {}, "repeated_lines"),
    ("buy now " * 40, {"min_words_for_repetition": 20}, "repeated_ngrams"),
    ("\ufffd\ufffd\ufffd broken text \ufffd\ufffd\ufffd\ufffd decoding", {}, "mostly_non_text"),
    ("payload " + "QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVphYmNkZWZnaGlqa2xtbm9wcXJzdHV2d3h5ejAxMjM0NTY3ODk" * 3, {},
     "mostly_non_text"),
])
def test_each_filter_drops_with_its_reason(text, cfg, reason):
    assert _reason(text, **cfg) == reason


def test_duplicate_5grams_are_caught_even_when_no_single_ngram_dominates():
    words = PROSE.split()
    text = " ".join(words + words[:12] + words[5:20] + words[3:18])
    assert _reason(text, min_words_for_repetition=20) == "repeated_ngrams"


def test_ordinary_prose_and_agent_traces_are_kept():
    trace = ("system:\nYou are a careful assistant.\n\nuser:\nConvert 12.5 miles to kilometers.\n\nassistant:\n"
             'I will use a tool.\ncall convert_units({"from": "mi", "to": "km", "value": 12.5})\n\ntool:\n'
             "convert_units returned: 20.12\n\nassistant:\nThe answer is 20.12 km.")
    kept, dropped = quality_filter([{"id": "a", "text": PROSE}, {"id": "b", "text": trace}])
    assert [r["id"] for r in kept] == ["a", "b"] and dropped == []


def test_drop_detail_explains_the_measurement():
    _, dropped = quality_filter([{"id": "x", "text": "tiny"}])
    assert dropped[0].stage == "quality" and "4 chars < 20" in dropped[0].detail
