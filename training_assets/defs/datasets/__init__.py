"""Dataset stage: SFT, preference, GRPO and pretraining datasets as Parquet."""
