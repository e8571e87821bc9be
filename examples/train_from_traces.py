"""The seed's first example: build an SFT corpus from traces, plan the run, run it — then the same for DPO and GRPO.

    python examples/train_from_traces.py

As the seed writes it, with the module renamed to ``training_assets`` and a tiny random-init base
(``_tiny.tiny_base()``) in place of ``Qwen/Qwen2.5-1.5B-Instruct``.
"""

from _tiny import sample_traces, tiny_base

TINY_BASE = tiny_base()  # the seed: "Qwen/Qwen2.5-1.5B-Instruct"
traces = sample_traces()  # plain dicts of the trace schema

from training_assets import training_data as td
from training_assets.trainers import get_trainer, TrainConfig

# 1) Build an SFT corpus from traces (deterministic, no GPU).
examples = td.build_sft_examples(traces)

# 2) Plan the run (pure — no torch needed to inspect it).
trainer = get_trainer("sft", TrainConfig(base_model=TINY_BASE,
                                         epochs=1, batch_size=8))
print(trainer.plan(examples))   # {planned_steps, effective_batch, ...}

# 3) Run it (needs training-assets[train] + a GPU for a real base model).
report = trainer.train(examples)   # {steps, losses, final_loss, ...}

# The same for preference pairs (DPO) and GRPO groups.
pairs = td.build_preference_pairs(traces)
dpo = get_trainer("dpo", TrainConfig(base_model=TINY_BASE, output_dir="checkpoints/dpo", epochs=1, batch_size=8))
print(dpo.plan(pairs))
dpo_report = dpo.train(pairs)

groups = td.build_grpo_groups(traces)
grpo = get_trainer("grpo", TrainConfig(base_model=TINY_BASE, output_dir="checkpoints/grpo", epochs=1, batch_size=8))
print(grpo.plan(groups))
grpo_report = grpo.train(groups)

for name, result in (("sft", report), ("dpo", dpo_report), ("grpo", grpo_report)):
    print(name, {k: result[k] for k in ("steps", "final_loss", "tokens_per_s", "checkpoint_dir")})
