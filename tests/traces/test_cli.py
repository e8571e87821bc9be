"""training-assets ingest: a report for people, JSON for machines, clear errors."""

import json
import subprocess
import sys

from training_assets import cli, sample_traces


def test_ingest_json_report(tmp_path, capsys):
    written = sample_traces.write_samples(tmp_path)
    assert cli.main(["ingest", written["batches"][1], "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["lines"] == report["valid"] + report["quarantined"]
    assert report["quarantined"] == sum(report["reasons"].values()) > 0
    assert cli.main(["ingest", written["batches"][1], "--strict"]) == 1


def test_ingest_missing_file_is_a_clean_error(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "training_assets.cli", "ingest", str(tmp_path / "x.jsonl")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "x.jsonl: no such file" in proc.stderr and "Traceback" not in proc.stderr


def test_ingest_applies_the_batch_caps(tmp_path, capsys):
    written = sample_traces.write_samples(tmp_path)
    assert cli.main(["ingest", written["batches"][1], "--max-batch-lines", "10"]) == 2
    err = capsys.readouterr().err
    assert "max_batch_lines=10" in err and "traces-0002.jsonl.gz" in err
