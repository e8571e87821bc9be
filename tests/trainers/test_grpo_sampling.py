"""GRPO's rollout sampling as a component (trainers/rollouts.py) and its vLLM options as a spec of their own."""

import pytest

from training_assets.rollout_buffer import Generation
from training_assets.trainers import GrpoSpec, LoraSpec, TrainConfig, get_trainer
from training_assets.trainers.config import VllmSpec
from training_assets.trainers.policy_sync import VllmPolicySync
from training_assets.trainers.rollouts import LocalSampler, VllmSampler, pick_sampler

URL = "http://127.0.0.1:8000"


class FixedSampler:
    """A stand-in sampler: completions [7], [7, 8], ... per prompt; records what it was asked."""

    name, reason = "fixed", "test"

    def __init__(self, group_size):
        self.group_size, self.asked = group_size, []

    def sample(self, prompts, model):
        self.asked.append([list(p) for p in prompts])
        group = [Generation(text="x" * (k + 1), token_ids=[7] * (k + 1)) for k in range(self.group_size)]
        return [list(group) for _ in prompts]


def test_the_step_scores_what_the_sampler_drew_and_normalises_within_each_group(tokenizer, grpo_groups, tmp_path):
    config = TrainConfig(output_dir=str(tmp_path), grpo=GrpoSpec(num_generations=2, max_new_tokens=4))
    trainer = get_trainer("grpo", config, tokenizer=tokenizer,
                          reward_fn=lambda completions, **kw: [float(len(c)) for c in completions])
    rows = trainer.prepare(grpo_groups[:2], tokenizer)
    trainer.sampler = FixedSampler(2)
    batch = trainer.micro_batch(rows, model=None)  # the sampler is the only thing that would touch the model
    assert trainer.sampler.asked == [[r["prompt_ids"] for r in rows]]
    # rewards differ by one within each group of two: advantages ±1/√2 (Bessel std), the same in both groups
    assert batch["advantages"].tolist() == pytest.approx([-0.7070, 0.7070] * 2, abs=1e-3)
    assert batch["completion_mask"].sum(dim=1).tolist() == [1.0, 2.0, 1.0, 2.0]
    assert trainer.result_extra()["rollout_sampler"] == {"sampler": "fixed", "reason": "test"}


def test_the_sampler_is_picked_from_the_spec_and_the_model(tokenizer):
    from transformers import AutoConfig, AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(
        "qwen2", hidden_size=16, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
        intermediate_size=32, vocab_size=len(tokenizer))).eval()
    for wanted in ("lean", "transformers"):
        sampler = pick_sampler(GrpoSpec(sampler=wanted, num_generations=3, max_new_tokens=2), model, tokenizer)
        assert isinstance(sampler, LocalSampler) and sampler.name == wanted
        groups = sampler.sample([[1, 2, 3], [4]], model)
        assert [len(g) for g in groups] == [3, 3] and all(len(g.token_ids) <= 2 for group in groups for g in group)
    assert not model.training  # the sampler leaves the model in the mode it found it in
    vllm_spec = GrpoSpec(rollout="vllm", vllm=VllmSpec(base_url=URL, model="base"))
    sync = VllmPolicySync(client=None, base_model="base", run="r", adapter_dir=None)
    assert isinstance(pick_sampler(vllm_spec, model, tokenizer, sync), VllmSampler)
    with pytest.raises(ValueError, match="pass sync="):
        pick_sampler(vllm_spec, model, tokenizer)


def test_vllm_options_are_one_nested_spec_and_the_old_flat_names_are_refused():
    config = TrainConfig.from_dict({"lora": {"r": 4}, "grpo": {"rollout": "vllm", "vllm": {
        "base_url": URL, "model": "base", "sync_steps": 2, "max_attempts": 3}}})
    assert config.grpo.vllm == VllmSpec(base_url=URL, model="base", sync_steps=2, max_attempts=3)
    assert TrainConfig.from_dict(config.to_dict()) == config
    assert not [name for name in GrpoSpec.model_fields if name.startswith("vllm_")]
    with pytest.raises(ValueError, match="unknown field 'grpo.vllm_base_url'"):
        TrainConfig.from_dict({"grpo": {"rollout": "vllm", "vllm_base_url": URL}})
    needs_url = r"^TrainConfig.grpo: GrpoSpec: rollout='vllm' needs vllm.base_url \(vllm=VllmSpec\("
    with pytest.raises(ValueError, match=needs_url):
        TrainConfig.from_dict({"grpo": {"rollout": "vllm"}})
    with pytest.raises(ValueError, match="vllm is set but rollout='local' does not sample from it"):
        GrpoSpec(vllm=VllmSpec(base_url=URL, model="base"))


def test_the_policy_sync_reads_the_vllm_spec(tmp_path):
    spec = VllmSpec(base_url=URL + "/v1", model="base", api_key_env="MY_KEY", adapter_dir=str(tmp_path / "a"),
                    sync_steps=3, max_attempts=2, backoff_s=0.1, max_backoff_s=0.4, timeout_s=9.0)
    config = TrainConfig(output_dir=str(tmp_path), run_name="run", lora=LoraSpec(r=4),
                         grpo=GrpoSpec(rollout="vllm", vllm=spec))
    sync = VllmPolicySync.from_config(config)
    client = sync.client
    assert (sync.base_model, sync.sync_steps, sync.adapter_dir) == ("base", 3, (tmp_path / "a").resolve())
    assert (client.base_url, client.api_key_env, client.timeout_s) == (URL, "MY_KEY", 9.0)
    assert (client.retry.max_attempts, client.retry.backoff_s, client.retry.max_backoff_s) == (2, 0.1, 0.4)


def test_the_dagster_run_config_nests_the_vllm_spec():
    from training_assets.defs.settings import spec_config

    options = spec_config("GrpoOptions", GrpoSpec)
    assert options().model_dump()["vllm"] is None
    chosen = options(rollout="vllm", vllm={"base_url": URL, "model": "base", "sync_steps": 2})
    assert GrpoSpec(**chosen.model_dump()).vllm == VllmSpec(base_url=URL, model="base", sync_steps=2)
    nested = options.model_fields["vllm"].annotation.__args__[0]
    assert nested.model_fields["sync_steps"].description == VllmSpec.model_fields["sync_steps"].description
    with pytest.raises(Exception, match="sync_step"):
        options(vllm={"base_url": URL, "sync_step": 2})
