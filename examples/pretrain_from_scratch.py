"""The seed's pretraining example: a byte-level BPE tokenizer trained on the corpus, then a
random-init decoder pretrained on it.

    python examples/pretrain_from_scratch.py

As the seed writes it, with the module renamed to ``training_assets`` and a tiny ``PretrainSpec``
(hidden 64, 2 layers) in place of the seed's 1024-wide, 24-layer one; ``curated_records`` come from
``_tiny``, models go under ``$TRAINING_ASSETS_MODELS`` (default ``/models``). On a CPU host the
seed's ``distributed="fsdp"`` is left out: sharded training needs one process per GPU started by a
launcher (``examples/scale_out.py``), and in a plain process it is an error naming the command.
"""

from _tiny import MODELS, curated_records as _records

curated_records = _records()

from training_assets.training_pipeline import run_pretrain_pipeline
from training_assets.trainers import TrainConfig, PretrainSpec

report = run_pretrain_pipeline(
    TrainConfig(output_dir=f"{MODELS}/tiny-lm", max_seq_len=2048, precision="bf16",
                lr=3e-4, warmup_steps=2000, lr_scheduler="cosine",
                save_steps=1000),
    corpus=curated_records,                 # {text} records from the data engine
    spec=PretrainSpec(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                      max_position_embeddings=2048),
    train_tokenizer_first=True,             # BPE tokenizer trained on the corpus
)

print(report.data, {k: report.train[k] for k in ("steps", "final_loss", "tokens_per_s")})
