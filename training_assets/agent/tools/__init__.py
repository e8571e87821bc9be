"""The MCP tools, one module per area; importing this package registers every tool in ``TOOLS``
(a tool is its declaration there plus its line in its persona's YAML; nothing else lists it).

    data.py         curate_corpus dedup_corpus decontaminate_corpus dataset_lineage train_tokenizer
                    build_training_dataset compose_reward
    training.py     one tool per training kind (training_assets.kinds: pretrain_model train_sft train_dpo
                    train_grpo), merge_adapters_ties
    registry.py     evaluate_checkpoint register_model registry_list pick_for_role rollback_role
    observe.py      list_assets get_run cancel_run
    orchestrate.py  execute_workflow
"""

from training_assets.agent.tools import data, observe, orchestrate, registry, training  # noqa: F401  (registers)
from training_assets.agent.tools.base import TOOLS, ToolSpec

__all__ = ["TOOLS", "ToolSpec"]
