"""The seed's SFT pipeline on sample traces, and the CLI verbs."""

import json

from training_assets import cli
from training_assets.peft_manager import LoraSpec
from training_assets.trainers import TrainConfig


def _traces(tmp_path):
    from training_assets.sample_traces import make_batches
    from training_assets.traces import read_batch

    batches, _ = make_batches()
    path = tmp_path / "batch.jsonl"
    path.write_bytes(b"".join(line if line.endswith(b"\n") else line + b"\n" for line in batches[0]))
    return read_batch(path).valid


def test_run_sft_pipeline_on_traces_with_eval_and_registration(tmp_path, tokenizer, base_model_dir):
    from training_assets.registry import ModelRegistry
    from training_assets.evaluation import cases_from_held_out
    from training_assets.training_pipeline import DeploymentTarget, run_sft_pipeline

    config = TrainConfig(base_model=str(base_model_dir), output_dir=str(tmp_path / "sft"), max_steps=2, batch_size=4,
                         lr=2e-4, lora=LoraSpec(r=4, alpha=8))
    cases = cases_from_held_out([{"id": "1", "prompt": "What is 2 plus 2?", "answer": "4", "category": "math"}])
    registry = ModelRegistry(f"sqlite:///{tmp_path / 'mlflow.db'}")
    report = run_sft_pipeline(config, traces=_traces(tmp_path), eval_cases=cases, tokenizer=tokenizer, registry=registry,
                              deploy=DeploymentTarget(role="generator", served_model_name="sft"), checkpoint_id="sft-v1")
    assert report.data["examples"] > 0 and report.plan["planned_steps"] == 2
    assert len(report.train["losses"]) == 2
    assert report.checkpoint["kind"] == "adapter" and report.checkpoint["base_model_dir"] == str(base_model_dir.resolve())
    assert json.loads((tmp_path / "sft" / "manifest.json").read_text())["checkpoint_dir"] == report.checkpoint["checkpoint_dir"]
    assert report.eval["n_cases"] == 1
    assert report.deployment["role"] == "generator"
    assert registry.pick_for_role("generator").role == "generator"
    assert report["train"]["steps"] == 2 and set(report) == {"data", "plan", "train", "checkpoint", "eval", "deployment"}


def test_cli_train_plans_by_default_and_merges(tmp_path, capsys, tokenizer_dir, base_model_dir, sft_examples):
    examples = tmp_path / "sft.jsonl"
    examples.write_text("".join(json.dumps(e) + "\n" for e in sft_examples))
    code = cli.main(["train", "sft", "--examples", str(examples), "--set", f"base_model={base_model_dir}",
                     "--set", f"tokenizer={tokenizer_dir}", "--set", "max_steps=5", "--set", "lora.r=4",
                     "--output-dir", str(tmp_path / "run"), "--json"])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert out["plan"]["planned_steps"] == 5 and out["config"]["lora"]["r"] == 4
    assert not (tmp_path / "run" / "final").exists()  # plan only

    code = cli.main(["train", "sft", "--examples", str(examples), "--set", f"base_model={base_model_dir}",
                     "--set", f"tokenizer={tokenizer_dir}", "--set", "max_steps=1", "--set", "lora.r=4",
                     "--output-dir", str(tmp_path / "run"), "--execute", "--json"])
    assert code == 0
    executed = json.loads(capsys.readouterr().out)
    first = executed["checkpoint_dir"]
    assert executed["plan"]["planned_steps"] == 1 and executed["manifest"]["train"]["steps"] == 1
    assert json.loads((tmp_path / "run" / "manifest.json").read_text())["checkpoint_dir"] == first
    cli.main(["train", "sft", "--examples", str(examples), "--set", f"base_model={base_model_dir}",
              "--set", f"tokenizer={tokenizer_dir}", "--set", "max_steps=1", "--set", "lora.r=4", "--set", "seed=1",
              "--output-dir", str(tmp_path / "run2"), "--execute", "--json"])
    second = json.loads(capsys.readouterr().out)["checkpoint_dir"]
    assert cli.main(["merge-adapters", first, second, "-o", str(tmp_path / "merged"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["tensors"] > 0
    assert cli.main(["train", "dpo", "--root", str(tmp_path / "empty")]) == 2
    assert "materialise sft_checkpoint first" in capsys.readouterr().err


def test_cli_sets_nested_options_and_names_a_bad_choice(tmp_path, capsys, tokenizer_dir, base_model_dir,
                                                         preference_pairs):
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps(p) + "\n" for p in preference_pairs))
    common = ["train", "dpo", "--examples", str(pairs), "--set", f"base_model={base_model_dir}",
              "--set", f"tokenizer={tokenizer_dir}", "--output-dir", str(tmp_path / "run"), "--json"]
    assert cli.main([*common, "--set", "dpo.loss_type=ipo", "--set", "dpo.beta=0.2"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["config"]["dpo"] == {"beta": 0.2, "loss_type": "ipo", "label_smoothing": 0.0, "precompute_ref_logps": True}
    assert out["plan"]["planned_steps"] == 2  # 16 pairs, batch 8, one epoch
    assert cli.main([*common, "--set", "dpo.loss_type=ipoo"]) == 2
    assert "TrainConfig.dpo.loss_type: Input should be 'sigmoid', 'ipo' or 'hinge'" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()  # plans write nothing


def test_run_pretrain_pipeline_on_texts_with_eval_and_registration(tmp_path, tokenizer):
    from training_assets.registry import ModelRegistry
    from training_assets.evaluation import cases_from_held_out
    from training_assets.training_pipeline import DeploymentTarget, run_pretrain_pipeline

    config = TrainConfig(output_dir=str(tmp_path / "base"), max_steps=2, batch_size=2, max_seq_len=64)
    texts = [f"The tool returned {n}. The answer is {n}." for n in range(40)] + [""]
    cases = cases_from_held_out([{"id": "1", "prompt": "What is 2 plus 2?", "answer": "4", "category": "math"}])
    registry = ModelRegistry(f"sqlite:///{tmp_path / 'mlflow.db'}")
    report = run_pretrain_pipeline(config, corpus=texts, eval_cases=cases, tokenizer=tokenizer, registry=registry,
                                   deploy=DeploymentTarget(role="base", served_model_name="base"), checkpoint_id="base-v1")
    assert report.data["documents"] == 40 and report.data["windows"] > 0  # the empty text is skipped
    assert report.plan["planned_steps"] == 2 and len(report.train["losses"]) == 2
    assert report.checkpoint["kind"] == "full"
    assert report.eval["n_cases"] == 1 and report.deployment["role"] == "base"
    assert registry.pick_for_role("base").role == "base"
