"""GRPO's rollout samplers: the prompts of a micro-batch in, ``num_generations`` completions per prompt out.

    sampler = pick_sampler(config.grpo, model, tokenizer, policy_sync)   # once per run
    groups = sampler.sample([row["prompt_ids"] for row in rows], model)  # [[Generation] × G] per prompt

A ``Sampler`` only samples: scoring, group advantages and the loss are the trainer's
(``trainers/grpo.py``), so one GRPO step reads sample → score → advantages → loss whichever
sampler drew. ``pick_sampler`` chooses from the spec (and, locally, from the model):

* ``lean`` — ``decoding.LeanDecoder``: the policy's own weights, fused, with a preallocated KV cache
  (``GrpoSpec.sampler="lean"``, Llama/Qwen2/Mistral layouts).
* ``transformers`` — ``modeling.sample_completions``: ``generate``'s draws without its per-step
  overhead (``GrpoSpec.sampler="transformers"``, or the model the lean decoder does not cover).
* ``generate`` — ``model.generate``: a checkpoint whose generation_config adds logits processors
  (only ``generate`` applies them), whatever the spec asks.
* ``vllm`` — ``rollout_buffer.VllmRolloutClient`` on the newest adapter version ``policy_sync``
  loaded (``GrpoSpec.rollout="vllm"``); each token comes with the sampler's log-prob (the old policy).

The three local decoders draw the same tokens from the same RNG state: every prompt × G in one
left-padded batch, one ``torch.multinomial`` per step (``tests/trainers/test_rollouts.py`` holds them
to it). torch, ``modeling`` and ``decoding`` are imported when a local sampler runs: picking the
vLLM sampler, and planning, import no torch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from training_assets.rollout_buffer import Generation, VllmRolloutClient
from training_assets.trainers.config import GrpoSpec
from training_assets.trainers.policy_sync import VllmPolicySync


class Sampler(Protocol):
    """Draws each prompt's group of completions from the current policy."""

    name: str  # lean | transformers | generate | vllm
    reason: str  # why this sampler (recorded in the result as rollout_sampler)

    def sample(self, prompts: Sequence[Sequence[int]], model: Any) -> list[list[Generation]]:
        """``num_generations`` unscored generations per prompt: token ids and text, log-probs where the sampler
        has them (vLLM)."""
        ...


def choose_sampler(model: Any, wanted: str) -> dict[str, str]:
    """Which decoder samples local rollouts, and why: ``lean`` when asked for and the model allows it,
    ``transformers`` (``modeling.sample_completions``) otherwise, ``generate`` when the checkpoint's
    generation config adds logits processors (only ``generate`` applies them)."""
    from training_assets.trainers.decoding import unsupported  # torch: planning stays torch-free
    from training_assets.trainers.modeling import plain_sampling  # torch: planning stays torch-free

    if not plain_sampling(model):
        return {"sampler": "generate", "reason": "the checkpoint's generation_config adds logits processors"}
    if wanted != "lean":
        return {"sampler": "transformers", "reason": f"GrpoSpec.sampler={wanted!r}"}
    reason = unsupported(model)
    if reason:
        return {"sampler": "transformers", "reason": f"the lean decoder does not cover this model: {reason}"}
    return {"sampler": "lean", "reason": "GrpoSpec.sampler='lean'"}


# A local decoder: (model, left-padded ids (N, P), attention mask (N, P), spec, eos id, pad id) -> (N, ≤ max_new_tokens)
Decode = Callable[[Any, Any, Any, GrpoSpec, int | None, int], Any]


def _lean(model: Any, ids: Any, attn: Any, spec: GrpoSpec, eos_id: int | None, pad_id: int) -> Any:
    from training_assets.trainers.decoding import LeanDecoder  # torch: planning stays torch-free

    # the policy's weights as of this step, folded once per rollout
    return LeanDecoder(model).sample(ids, attn, spec.max_new_tokens, spec.temperature, eos_id, pad_id)


def _transformers(model: Any, ids: Any, attn: Any, spec: GrpoSpec, eos_id: int | None, pad_id: int) -> Any:
    from training_assets.trainers.modeling import sample_completions  # torch: planning stays torch-free

    return sample_completions(model, ids, attn, spec.max_new_tokens, spec.temperature, eos_id, pad_id)


def _generate(model: Any, ids: Any, attn: Any, spec: GrpoSpec, eos_id: int | None, pad_id: int) -> Any:
    from training_assets.trainers.modeling import device_of  # torch: planning stays torch-free

    device = device_of(model)
    return model.generate(input_ids=ids.to(device), attention_mask=attn.to(device), do_sample=True,
                          temperature=spec.temperature, top_k=0, top_p=1.0, max_new_tokens=spec.max_new_tokens,
                          pad_token_id=pad_id, eos_token_id=eos_id, use_cache=True)[:, ids.shape[1]:]


DECODERS: dict[str, Decode] = {"lean": _lean, "transformers": _transformers, "generate": _generate}


@dataclass
class LocalSampler:
    """The policy samples itself: every prompt × G in one left-padded batch, decoded by ``DECODERS[name]``."""

    name: str
    reason: str
    tokenizer: Any
    spec: GrpoSpec

    def sample(self, prompts: Sequence[Sequence[int]], model: Any) -> list[list[Generation]]:
        import torch  # torch: planning stays torch-free

        tok, G = self.tokenizer, self.spec.num_generations
        pad_id = tok.pad_token_id if tok.pad_token_id is not None else 0
        batch = [list(p) for p in prompts for _ in range(G)]
        P = max(len(p) for p in batch)
        ids = torch.tensor([[pad_id] * (P - len(p)) + p for p in batch])  # left-padded (N·G, P)
        attn = torch.tensor([[0] * (P - len(p)) + [1] * len(p) for p in batch])
        was_training = model.training
        model.eval()
        try:
            with torch.inference_mode():
                completions = DECODERS[self.name](model, ids, attn, self.spec, tok.eos_token_id, pad_id).cpu().tolist()
        finally:
            model.train(was_training)
        return [[self._generation(c) for c in completions[k * G:(k + 1) * G]] for k in range(len(prompts))]

    def _generation(self, tokens: list[int]) -> Generation:
        eos = self.tokenizer.eos_token_id
        if eos in tokens:  # the EOS stays (the policy learns to stop); the padding after it goes
            tokens = tokens[: tokens.index(eos) + 1]
        return Generation(text=self.tokenizer.decode(tokens, skip_special_tokens=True), token_ids=tokens)


@dataclass
class VllmSampler:
    """A vLLM server samples the newest adapter version ``sync`` loaded (the base model before the first sync)."""

    sync: VllmPolicySync
    spec: GrpoSpec
    name: str = "vllm"
    reason: str = "GrpoSpec.rollout='vllm'"

    def sample(self, prompts: Sequence[Sequence[int]], model: Any) -> list[list[Generation]]:
        # the name is read per rollout: policy_sync moves it to <run>-v<step> after each sync
        client = VllmRolloutClient(self.sync.client.base_url, self.sync.served_name, client=self.sync.client)
        G, spec = self.spec.num_generations, self.spec
        return [client.generate(p, G, spec.max_new_tokens, spec.temperature) for p in prompts]


def pick_sampler(spec: GrpoSpec, model: Any, tokenizer: Any, sync: VllmPolicySync | None = None) -> Sampler:
    """The sampler ``spec`` asks for: vLLM for rollout="vllm" (``sync`` keeps the server on the policy), else the
    local decoder ``choose_sampler`` picks for ``model`` (its layout does not change during a run: pick once)."""
    if spec.rollout == "vllm":
        if sync is None:
            raise ValueError("pick_sampler: GrpoSpec.rollout='vllm' samples through a VllmPolicySync; pass sync= "
                             "(GRPOTrainer builds it in before_loop)")
        return VllmSampler(sync, spec)
    choice = choose_sampler(model, spec.sampler)
    return LocalSampler(choice["sampler"], choice["reason"], tokenizer, spec)
