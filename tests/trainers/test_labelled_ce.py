"""The LM head runs only on the positions that have a target: the same loss and gradients as the full logits."""

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoConfig, AutoModelForCausalLM

from training_assets.trainers.modeling import IGNORE_INDEX, ones_mask, pad_rows, shifted_ce


def _model(arch):
    torch.manual_seed(0)
    config = AutoConfig.for_model(arch, vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    return AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").float()


def _batch():
    rows = [(list(range(1, 30)), [IGNORE_INDEX] * 25 + [26, 27, 28, 29]),
            (list(range(40, 52)), [IGNORE_INDEX] * 6 + list(range(46, 52))),
            (list(range(60, 70)), [IGNORE_INDEX] * 10)]  # no target at all
    return {"input_ids": pad_rows([r for r, _ in rows], 0), "labels": pad_rows([lab for _, lab in rows], IGNORE_INDEX),
            "attention_mask": ones_mask([len(r) for r, _ in rows])}


def _reference(model, batch):
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, :-1]
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch["labels"][:, 1:].reshape(-1),
                           ignore_index=IGNORE_INDEX)


class Wrapped(torch.nn.Module):
    """Stands for DDP: a ``module`` attribute, so the model's own forward is used."""

    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, **kwargs):
        return self.module(**kwargs)


@pytest.mark.parametrize(("arch", "wrapped"), [("llama", False), ("qwen2", False), ("llama", True)])
def test_the_loss_and_gradients_equal_the_full_logits_and_the_head_sees_only_target_positions(arch, wrapped):
    model, batch = _model(arch), _batch()
    expected = _reference(model, batch)
    expected.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    head_rows = []
    model.lm_head.register_forward_hook(lambda _, args, out: head_rows.append(args[0].reshape(-1, 32).shape[0]))
    loss, n = shifted_ce(Wrapped(model) if wrapped else model, batch, "torch")
    loss.backward()
    assert n == 4 + 6
    assert torch.allclose(loss, expected, atol=1e-6)
    for name, p in model.named_parameters():
        assert torch.allclose(p.grad, grads[name], atol=1e-6), name
    assert head_rows == [3 * 29 if wrapped else 10]  # the wrapped model pays for every position


def test_a_micro_batch_without_targets_is_a_connected_zero():
    model, batch = _model("llama"), _batch()
    batch["labels"][:] = IGNORE_INDEX
    loss, n = shifted_ce(model, batch, "torch")
    assert n == 0.0 and loss.item() == 0.0 and loss.requires_grad
