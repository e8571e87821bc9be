"""Shared prefixes in SFT: computed once per micro-batch, the same loss and gradients as the full rows."""

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from training_assets.trainers.modeling import IGNORE_INDEX, ones_mask, pad_rows, prefix_batch, shared_prefix_ce, shifted_ce
from training_assets.trainers.sft import shared_prefixes

SYSTEM_A = list(range(10, 60))  # 50 tokens: one tool set's system turn
SYSTEM_B = list(range(100, 140))  # 40 tokens: another


def row(prefix, tail, answer):
    ids = prefix + tail + answer
    return {"input_ids": ids, "labels": [IGNORE_INDEX] * (len(prefix) + len(tail)) + answer}


ROWS = [row(SYSTEM_A, [200, 201, 202], [300, 301, 302, 303]),
        row(SYSTEM_B, [210, 211], [310, 311]),
        row(SYSTEM_A, [220], [320, 321, 322, 323, 324, 325]),
        row([7, 8, 9], [230, 231], [330]),  # shares nothing: runs whole
        row(SYSTEM_B, [240, 241, 242, 243], [340, 341, 342]),
        row(SYSTEM_A, [200, 201, 250], [350, 351])]  # shares 53 tokens with the first row


def test_groups_share_what_all_members_have_and_never_reach_a_label():
    groups, row_group = shared_prefixes([r["input_ids"] for r in ROWS], [r["labels"] for r in ROWS])
    assert row_group == [0, 1, 0, -1, 1, 0]
    assert groups == [(0, 50), (1, 40)]  # what every member has: the system turn (rows 0 and 5 share 53)
    for r, g in zip(ROWS, row_group):
        if g >= 0:
            assert all(label == IGNORE_INDEX for label in r["labels"][1:groups[g][1] + 1])
    assert shared_prefixes([[1, 2, 3], [4, 5, 6]], [[-100, 2, 3], [-100, 5, 6]]) is None
    # a long row alone is a group of its own: the suffix batch is not padded to its whole length
    alone = [row(SYSTEM_A, [1], [2]), row(SYSTEM_A, [3], [4]), row(list(range(600, 700)), [5], [6])]
    groups, row_group = shared_prefixes([r["input_ids"] for r in alone], [r["labels"] for r in alone])
    assert row_group == [0, 0, 1] and groups == [(0, 50), (2, 100)]
    # a labelled token early in a row stops the prefix before it
    early = [row(SYSTEM_A[:5], [], SYSTEM_A[5:]), row(SYSTEM_A, [1], [2])]
    assert shared_prefixes([r["input_ids"] for r in early], [r["labels"] for r in early]) is None


@pytest.mark.parametrize(("arch", "order"), [("llama", 1), ("qwen2", 1), ("llama", -1)])
def test_the_loss_and_gradients_equal_the_full_rows(arch, order):
    rows = ROWS[::order]  # reversed: the first group's prefix is not the longest
    torch.manual_seed(0)
    config = AutoConfig.for_model(arch, vocab_size=400, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").float()
    model.train()
    full = {"input_ids": pad_rows([r["input_ids"] for r in rows], 0),
            "labels": pad_rows([r["labels"] for r in rows], IGNORE_INDEX),
            "attention_mask": ones_mask([len(r["input_ids"]) for r in rows])}
    expected, n_expected = shifted_ce(model, full, "torch")
    expected.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    shared = {**full, "shared": prefix_batch(rows, *shared_prefixes([r["input_ids"] for r in rows],
                                                                    [r["labels"] for r in rows]), 0)}
    loss, n = shared_prefix_ce(model, shared, "torch")
    loss.backward()
    assert n == n_expected == sum(len([t for t in r["labels"][1:] if t != IGNORE_INDEX]) for r in rows)
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-6)
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, grads[name], rtol=1e-4, atol=1e-6, msg=name)


def test_the_sft_trainer_shares_only_unpacked_rows_without_gradient_checkpointing(tokenizer):
    from training_assets.trainers import TrainConfig
    from training_assets.trainers.sft import SFTTrainer

    def collated(**options):
        trainer = SFTTrainer(TrainConfig(output_dir="unused", **options))
        trainer.tokenizer = tokenizer
        return trainer.collate([dict(r) for r in ROWS], model=None)

    assert "shared" in collated()
    assert "shared" not in collated(share_prefixes=False)
    assert "shared" not in collated(gradient_checkpointing=True)
    assert "shared" not in collated(distributed="ddp")


def test_a_row_does_not_shrink_a_long_shared_prefix_to_the_few_tokens_it_has_in_common():
    preamble = list(range(10, 50))  # 40 tokens every system turn begins with
    lists_tools, calc_tool = list(range(500, 800)), list(range(900, 1100))
    rows = [row(preamble + calc_tool, [1], [2]), row(preamble + lists_tools, [3], [4]),
            row(preamble + lists_tools, [5], [6]), row(preamble + calc_tool, [7], [8])]
    groups, row_group = shared_prefixes([r["input_ids"] for r in rows], [r["labels"] for r in rows])
    assert row_group == [0, 1, 1, 0] and groups == [(0, 240), (1, 340)]


def test_a_sliding_window_model_takes_the_full_rows_and_stops_trying_after_its_first_prefix_forward():
    torch.manual_seed(0)
    config = AutoConfig.for_model("qwen2", vocab_size=400, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                  use_sliding_window=True, sliding_window=16, max_window_layers=0,
                                  layer_types=["sliding_attention", "full_attention"])
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").float()
    full = {"input_ids": pad_rows([r["input_ids"] for r in ROWS], 0),
            "labels": pad_rows([r["labels"] for r in ROWS], IGNORE_INDEX),
            "attention_mask": ones_mask([len(r["input_ids"]) for r in ROWS])}
    shared = {**full, "shared": prefix_batch(ROWS, *shared_prefixes([r["input_ids"] for r in ROWS],
                                                                    [r["labels"] for r in ROWS]), 0)}
    widths = []
    model.model.register_forward_pre_hook(lambda _, args, kwargs: widths.append(kwargs["input_ids"].shape[0]),
                                          with_kwargs=True)  # the backbone: every path runs it
    expected, _ = shifted_ce(model, full, "torch")
    widths.clear()
    for _ in range(2):
        loss, _ = shared_prefix_ce(model, shared, "torch")
        assert torch.allclose(loss, expected)
    assert widths == [1, len(ROWS), len(ROWS)]  # one prefix forward (its cache has a sliding layer), then full rows
