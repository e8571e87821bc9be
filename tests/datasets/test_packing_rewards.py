"""Packing invariants and reward components (their doctests run here too)."""

import doctest
import random

import numpy as np
import pytest

from training_assets.training_data import grpo, packing, rewards
from training_assets.training_data.packing import IGNORE_INDEX, pack_sequences
from training_assets.training_data.rewards import compose_reward, score_reward


@pytest.mark.parametrize("module", [rewards, grpo, packing])
def test_doctests(module):
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


def test_packing_restores_every_document_and_never_trains_across_boundaries():
    rng = random.Random(0)
    docs = [[rng.randint(10, 99) for _ in range(rng.randint(0, 40))] for _ in range(50)]
    eos, pad, window = 2, 0, 16
    p = pack_sequences(docs, window, eos_id=eos, pad_id=pad)
    assert p.input_ids.shape == (p.n_windows, window) and p.input_ids.dtype == np.int32
    # every document comes back in order, each followed by EOS
    flat_ids, flat_doc = p.input_ids.reshape(-1), p.doc_ids.reshape(-1)
    for d, doc in enumerate(docs):
        assert flat_ids[flat_doc == d].tolist() == [*doc, eos]
    assert p.n_tokens == sum(len(d) + 1 for d in docs)
    for w in range(p.n_windows):
        ids, pos, doc, lab = p.input_ids[w], p.position_ids[w], p.doc_ids[w], p.labels[w]
        for t in range(window):
            if doc[t] < 0:
                assert ids[t] == pad and lab[t] == IGNORE_INDEX
            elif t == 0 or doc[t] != doc[t - 1]:
                assert pos[t] == 0 and lab[t] == IGNORE_INDEX  # a new document: nothing predicts it from the last one
            else:
                assert pos[t] == pos[t - 1] + 1 and lab[t] == ids[t]


def test_packing_edge_cases():
    empty = pack_sequences([], 8, eos_id=2, pad_id=0)
    assert empty.n_windows == 0 and empty.padding_fraction == 0.0
    long = pack_sequences([list(range(10, 30))], 8, eos_id=2, pad_id=0)
    assert long.n_windows == 3 and long.position_ids[1, 0] == 0 and (long.doc_ids[:, 0] == 0).all()
    with pytest.raises(ValueError, match="at least 2"):
        pack_sequences([[1]], 1, eos_id=2, pad_id=0)


def test_composite_reward_explains_itself_and_rejects_unknown_components():
    completions = ['[{"role": "assistant", "content": "The answer is 4."}]', "I give up."]
    scores = score_reward(completions, success=[True, False], expected_answer=["4", "4"])
    assert scores.components["success"] == [1.0, 0.0] and scores.components["answer"] == [1.0, 0.0]
    manual = [sum(scores.weights[k] * scores.components[k][i] for k in scores.weights) for i in range(2)]
    assert scores.total == pytest.approx(manual) and scores.total[0] > scores.total[1]
    assert compose_reward()(completions, success=[True, False], expected_answer=["4", "4"]) == scores.total
    with pytest.raises(ValueError, match="unknown reward components"):
        compose_reward({"vibes": 1.0})
    with pytest.raises(ValueError, match="needs the `success` column"):
        score_reward(completions, {"success": 1.0})


def test_cli_compose_reward_scores_traces_and_completions_per_component(tmp_path, capsys, make_trace):
    import json

    from training_assets import cli

    trace = make_trace("t", 0, True, 1.0).model_dump(mode="json", exclude_none=True)
    rows = [json.dumps(trace), json.dumps({"id": "c1", "completion": "The answer is 7.", "success": False,
                                           "expected_answer": "7"}), "not json"]
    path = tmp_path / "scored.jsonl"
    path.write_text("\n".join(rows) + "\n")
    assert cli.main(["compose-reward", str(path), "--weights", "success=1", "answer=0.5", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    by_id = {r["id"]: r for r in out["rows"]}
    assert by_id["t-a0"] == {"id": "t-a0", "total": 1.5, "success": 1.0, "answer": 1.0}
    assert by_id["c1"] == {"id": "c1", "total": 0.5, "success": 0.0, "answer": 1.0}
    assert out["skipped"][0]["line_no"] == 3 and "Expecting value" in out["skipped"][0]["reason"]
    assert out["mean"] == {"answer": 1.0, "success": 0.5}
    assert cli.main(["compose-reward", str(path)]) == 0
    text = capsys.readouterr().out
    assert "2 completions scored, 1 lines skipped" in text and "t-a0" in text
    assert cli.main(["compose-reward", str(path), "--weights", "nonsense=1"]) == 2
    assert "unknown reward components" in capsys.readouterr().err
