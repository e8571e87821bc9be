"""tracker="wandb": a real offline wandb run directory (what `wandb sync` uploads), nothing sent anywhere."""

import time
from pathlib import Path

import pytest

from training_assets import tracking
from training_assets.trainers import TrainConfig, get_trainer


def wandb_records(path):
    """The protobuf records of a ``run-<id>.wandb`` file (LevelDB-log framing: 7-byte header per chunk, 32 KiB blocks)."""
    from wandb.proto import wandb_internal_pb2

    data = Path(path).read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a wandb run file"
    pos, block, chunks = 7, 32768, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        length, kind = int.from_bytes(data[pos + 4:pos + 6], "little"), data[pos + 6]
        chunks += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST chunk: one record complete
            record = wandb_internal_pb2.Record()
            record.ParseFromString(chunks)
            chunks = b""
            yield record


def complete_records(path, wait_s=30):
    """The run file's records once its exit record is in: wandb's service process appends the history
    and the exit record asynchronously, and on a loaded machine they land a moment after finish()
    returns, so the file is read again until the exit record (the last one written) is there."""
    deadline = time.monotonic() + wait_s
    while True:
        records = list(wandb_records(path))
        if any(r.WhichOneof("record_type") == "exit" for r in records) or time.monotonic() > deadline:
            return records
        time.sleep(0.5)


def test_wandb_tracker_writes_an_offline_run_without_an_api_key(tmp_path, tokenizer, windows, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    assert tracking.wandb_mode() == "offline"
    config = TrainConfig(output_dir=str(tmp_path), max_steps=3, batch_size=4, tracker="wandb", run_name="pretrain-test",
                         tracker_tags={"asset": "base_checkpoint"})
    result = get_trainer("pretrain", config, tokenizer=tokenizer).train(windows)
    run_dir = Path(result["tracking_uri"])
    assert result["tracker"] == "wandb" and run_dir.parent == tmp_path / "wandb"
    assert run_dir.name.startswith("offline-run-") and run_dir.name.endswith(result["tracker_run_id"])
    [run_file] = run_dir.glob(f"run-{result['tracker_run_id']}.wandb")
    records = complete_records(run_file)
    [run] = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert run.display_name == "pretrain-test" and list(run.tags) == ["asset:base_checkpoint"]
    history = [{i.key or "/".join(i.nested_key): i.value_json for i in r.history.item}
               for r in records if r.WhichOneof("record_type") == "history"]  # an image's fields are nested keys
    assert [float(h["loss"]) for h in history if "loss" in h] == pytest.approx(result["losses"])
    assert [h["loss_curve/_type"] for h in history if "loss_curve/_type" in h] == ['"image-file"']
    [done] = [r.exit for r in records if r.WhichOneof("record_type") == "exit"]
    assert done.exit_code == 0


def test_a_failed_run_is_marked_failed(tmp_path, tokenizer, windows, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    config = TrainConfig(output_dir=str(tmp_path), max_steps=2, batch_size=4, tracker="wandb")
    trainer = get_trainer("pretrain", config, tokenizer=tokenizer)
    trainer.loss = lambda model, batch: (_ for _ in ()).throw(RuntimeError("loss exploded"))
    with pytest.raises(RuntimeError, match="loss exploded"):
        trainer.train(windows)
    [run_file] = (tmp_path / "wandb").glob("offline-run-*/run-*.wandb")
    [done] = [r.exit for r in complete_records(run_file) if r.WhichOneof("record_type") == "exit"]
    assert done.exit_code == 1
