"""The MCP tools, one module per area; importing this package registers every tool in ``TOOLS``.

    data.py         curate_corpus dedup_corpus decontaminate_corpus dataset_lineage train_tokenizer
                    build_training_dataset compose_reward
    training.py     pretrain_model train_sft train_dpo train_grpo merge_adapters_ties
    registry.py     evaluate_checkpoint register_model registry_list pick_for_role rollback_role
    observe.py      list_assets get_run cancel_run
    orchestrate.py  execute_workflow
"""

from training_assets.agent.tools import data, observe, orchestrate, registry, training  # noqa: F401  (registers)
from training_assets.agent.tools.base import TOOLS, ToolSpec

# The seed's tool names, then the platform's own (issue 11): the contract clients rely on.
TOOL_NAMES = (
    "curate_corpus", "dedup_corpus", "decontaminate_corpus", "dataset_lineage", "train_tokenizer",
    "build_training_dataset", "compose_reward", "pretrain_model", "train_sft", "train_dpo", "train_grpo",
    "merge_adapters_ties",
    "execute_workflow", "evaluate_checkpoint", "register_model", "registry_list", "pick_for_role", "rollback_role",
    "list_assets", "get_run", "cancel_run",
)

__all__ = ["TOOLS", "TOOL_NAMES", "ToolSpec"]
