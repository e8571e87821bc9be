"""base_model: the pretrained model the graph starts from, or random init (the demo's default).

    dagster asset materialize --select base_model --config-json '{"ops": {"base_model": {"config": {"model": "smollm2-135m-instruct"}}}}'

With a model, ``tokenizer`` adopts its tokenizer (with the tool-call template) and ``base_checkpoint``
its weights; lineage then starts at the weights' hash (this asset's data version).
"""

import dagster as dg
from pydantic import Field

from training_assets.base_model.selection import select_base_model
from training_assets.defs.automation import once_condition
from training_assets.defs.resources import DataRoot

BASE_MODEL_CODE_VERSION = "base-model-1"


class BaseModelConfig(dg.Config):
    model: str = Field("", description="A fetched recipe (training-assets models fetch NAME, e.g. smollm2-135m-instruct) "
                                       "or a Hugging Face model folder; empty: random init (pretrain from scratch).")


@dg.asset(group_name="tokenizer", code_version=BASE_MODEL_CODE_VERSION, kinds={"huggingface"},
          automation_condition=once_condition())
def base_model(context: dg.AssetExecutionContext, config: BaseModelConfig, data_root: DataRoot) -> dg.MaterializeResult:
    """The pretrained weights (verified against the hashes recorded when they were fetched), or random init."""
    record = select_base_model(data_root.root(), config.model)
    context.log.info(f"base model: {record.source or 'random init'} ({record.model_hash})")
    metadata = {"source": record.source or "random init", "model_hash": record.model_hash}
    if record.folder:
        metadata.update({"uri": dg.MetadataValue.path(record.folder), "model_type": str(record.model_type),
                         "parameters": int(record.parameters or 0)})
    return dg.MaterializeResult(metadata=metadata, data_version=dg.DataVersion(record.model_hash))
