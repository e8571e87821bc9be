"""The real job entry point, with two test hooks set by environment variables.

PAUSE_IN_CHECKPOINT=<name>: after writing the weights of that checkpoint's temp dir, write
PAUSE_MARKER and hang (so the test can SIGKILL mid-write). SLOW_FROM_CALL=<n>: from the n-th
micro-batch on, sleep 1 s per micro-batch (so a SIGKILL lands mid-training).
"""

import os
import pathlib
import sys
import time

import safetensors.torch as st

from training_assets.trainers import pretrain
from training_assets.trainers.accelerate_launch import main

_save = st.save_file
_collate = pretrain.PretrainTrainer.collate
_calls = [0]


def save_then_hang(tensors, filename, metadata=None):
    _save(tensors, filename, metadata)
    if os.environ.get("PAUSE_IN_CHECKPOINT") and os.environ["PAUSE_IN_CHECKPOINT"] in str(filename):
        pathlib.Path(os.environ["PAUSE_MARKER"]).write_text(str(filename))
        time.sleep(600)


def slow_collate(self, rows, model):
    _calls[0] += 1
    if os.environ.get("SLOW_FROM_CALL") and _calls[0] > int(os.environ["SLOW_FROM_CALL"]):
        time.sleep(1.0)
    return _collate(self, rows, model)


st.save_file = save_then_hang
pretrain.PretrainTrainer.collate = slow_collate
sys.exit(main())
