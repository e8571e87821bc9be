"""Tokenizer stage: byte-level BPE trained on the curated corpus, with its chat template."""
