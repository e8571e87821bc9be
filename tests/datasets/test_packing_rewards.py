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
