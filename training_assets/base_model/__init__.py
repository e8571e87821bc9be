"""A real pretrained base model: fetched offline by a pinned recipe, its chat template extended with tool calls."""
