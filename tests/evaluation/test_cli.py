"""The CLI verbs: evaluate, register, registry {list,pick,rollback}."""

import json

from training_assets.cli import main


def _json(capsys):
    return json.loads(capsys.readouterr().out)


def test_evaluate_prints_the_report_and_exits_by_the_gate(tiny_checkpoints, tmp_path, capsys):
    args = ["evaluate", str(tiny_checkpoints["adapter"]), "--no-benchmarks", "--max-new-tokens", "2", "--json"]
    assert main(args + ["--out", str(tmp_path / "report")]) == 0
    payload = _json(capsys)
    assert payload["gate"]["passed"] and payload["summary"]["n_cases"] == 32
    assert json.loads((tmp_path / "report" / "report.json").read_text())["metrics"] == payload["metrics"]
    assert main(args + ["--min-pass-rate", "0.99"]) == 1  # a random-init model cannot reach it
    assert "< min 0.990" in " ".join(_json(capsys)["gate"]["reasons"])


def test_register_then_pick_list_and_rollback(upstream, tracking_uri, tiny_checkpoints, capsys):
    common = ["--root", str(upstream), "--tracking-uri", tracking_uri, "--json"]
    assert main(["register", "merged_adapter", "--role", "generator", "--served-model-name", "agent", *common]) == 0
    first = _json(capsys)
    assert first["version"] == 1 and first["lineage"]["trace_partitions"] == ["traces-0001-aa", "traces-0002-bb"]
    assert main(["register", str(tiny_checkpoints["base"]), "--role", "generator", "--served-model-name", "agent",
                 "--checkpoint-id", "full-1", *common]) == 0
    assert _json(capsys)["version"] == 2
    assert main(["registry", "list", *common]) == 0
    assert [(r["version"], r["roles"]) for r in _json(capsys)] == [(1, []), (2, ["generator"])]
    assert main(["registry", "rollback", "generator", *common]) == 0
    assert _json(capsys)["entry"]["version"] == 1
    assert main(["registry", "pick", "generator", *common]) == 0
    assert _json(capsys)["lineage"]["corpus_version"] == "corpus-v1"


def test_register_refuses_a_checkpoint_whose_gate_failed(upstream, tracking_uri, capsys):
    report = upstream / "merged_eval_report"
    report.mkdir()
    (report / "report.json").write_text(json.dumps({
        "checkpoint_asset": "merged_adapter", "checkpoint_data_version": "dv-merged_adapter",
        "gate": {"passed": False, "reasons": ["pass_rate 0.100 < min 0.800"]}}))
    code = main(["register", "merged_adapter", "--role", "generator", "--served-model-name", "agent",
                 "--eval-report", str(report), "--root", str(upstream), "--tracking-uri", tracking_uri])
    assert code == 1
    assert "pass_rate 0.100 < min 0.800" in capsys.readouterr().err
    assert main(["registry", "pick", "generator", "--tracking-uri", tracking_uri]) == 2
    assert "no model registered for role 'generator'" in capsys.readouterr().err
