"""Serving a checkpoint behind an OpenAI-compatible server on 127.0.0.1 (transformers serve on CPU, vLLM on a GPU host)."""
