"""Training stage: base_checkpoint, sft_checkpoint, dpo_checkpoint, grpo_checkpoint, merged_adapter."""
