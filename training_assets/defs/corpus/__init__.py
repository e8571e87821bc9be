"""Curation stage: held-out sets, staged MinHash signatures, the curated corpus."""
