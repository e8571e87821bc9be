"""tokenizer_registry: new special tokens on an existing tokenizer, embeddings grown with mean init."""

import pytest

from training_assets import tokenizer_trainer as tt
from training_assets.tokenizer_registry import register_tokens

torch = pytest.importorskip("torch")


def _plain_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    core.train_from_iterator(["hello world, tools and calls"] * 20, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<eos>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    return PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<eos>")


def _tiny_model(vocab: int, tied: bool):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=2, tie_word_embeddings=tied))


@pytest.mark.parametrize("tied", [False, True])
def test_new_tokens_get_mean_embeddings_and_second_call_changes_nothing(tied):
    tokenizer = _plain_tokenizer()
    model = _tiny_model(len(tokenizer), tied)
    old_in = model.get_input_embeddings().weight.detach().clone()
    old_out = model.get_output_embeddings().weight.detach().clone()
    n_old = old_in.shape[0]

    first = register_tokens(tokenizer, model=model, special_tokens_map={"pad_token": tt.PAD})
    assert first.added == list(tt.SPECIAL_TOKENS) and first.embedding_rows_after == n_old + len(tt.SPECIAL_TOKENS)
    emb = model.get_input_embeddings().weight
    assert torch.equal(emb[:n_old], old_in)
    assert torch.allclose(emb[n_old:], old_in.mean(0).expand(len(tt.SPECIAL_TOKENS), -1))
    if not tied:
        assert torch.allclose(model.get_output_embeddings().weight[n_old:], old_out.mean(0).expand(len(tt.SPECIAL_TOKENS), -1))
    assert len(tokenizer.encode("a<|tool_call|>b", add_special_tokens=False)) == 3
    assert tokenizer.pad_token == tt.PAD

    snapshot = emb.detach().clone()
    second = register_tokens(tokenizer, model=model, special_tokens_map={"pad_token": tt.PAD})
    assert second.added == [] and second.vocab_after == first.vocab_after
    assert torch.equal(model.get_input_embeddings().weight, snapshot)
    assert "already" in second.reason


def test_tokens_already_in_the_trained_tokenizer_are_not_added_again():
    tokenizer = tt.train_tokenizer(["some text for training"] * 10, vocab_size=600)
    result = register_tokens(tokenizer)
    assert result.added == [] and set(result.already_present) == set(tt.SPECIAL_TOKENS)
