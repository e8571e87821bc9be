"""curate over the sample traces: every record answered, staged signatures reused, versions move."""

import gzip
import json

import pyarrow.parquet as pq
import pytest

from training_assets import data_engine, ingest, sample_traces
from training_assets.cli import main as cli
from training_assets.data_engine import staged
from training_assets.data_engine.corpus import CORPUS_FILE, DECISIONS_FILE

from .conftest import ingest_inbox


def _held_out(root):
    data_engine.write_held_out_sets(sorted((root / "held_out").glob("*.jsonl")), root)


def test_sample_corpus_drops_planted_contamination_and_relogs(sample_root):
    root, batch_ids = sample_root
    _held_out(root)
    report = data_engine.curate(root)
    table = data_engine.load_curated_corpus(root)
    assert {"id", "text", "source", "trace_id", "task_id", "batch_id"} <= set(table.column_names)
    decisions = {r["id"]: r for r in pq.read_table(root / "curated_corpus" / DECISIONS_FILE).to_pylist()}
    assert len(decisions) == report.stage_counts["input"] == 206
    contaminated = sorted(r["detail"] for r in decisions.values() if r["reason"] == "held_out_overlap")
    assert len(contaminated) == 2 and all("agent_tasks/" in d for d in contaminated)
    relogs = [i for i in decisions if i.endswith("-relog")]
    assert len(relogs) == 12
    rep = {r["id"]: r["representative"] for r in pq.read_table(root / "curated_corpus" / "clusters.parquet").to_pylist()}
    for relog in relogs:  # each re-logged trace and its original end up in one cluster, one of it kept
        original = relog.removesuffix("-relog")
        if decisions[original]["reason"] == "held_out_overlap":
            continue
        assert rep[relog] == rep[original] and decisions[rep[relog]]["kept"]
        assert not (decisions[relog]["kept"] and decisions[original]["kept"])
    kept_ids = set(table.column("id").to_pylist())
    assert kept_ids == {i for i, r in decisions.items() if r["kept"]}
    assert report.residual_overlaps == []
    assert report.version.drop_reasons["decontaminate/held_out_overlap"] == 2


def test_lineage_explains_kept_and_dropped_records(sample_root, capsys):
    root, _ = sample_root
    _held_out(root)
    data_engine.curate(root)
    dropped = next(r for r in pq.read_table(root / "curated_corpus" / DECISIONS_FILE).to_pylist()
                   if r["reason"] == "near_duplicate" or r["reason"] == "exact_duplicate")
    info = data_engine.lineage(dropped["id"], root)
    assert info["kept"] is False and info["cluster"]["representative"] == dropped["duplicate_of"]
    assert dropped["id"] in info["cluster"]["members"]
    assert cli(["lineage", dropped["id"], "--root", str(root), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["duplicate_of"] == dropped["duplicate_of"]
    assert cli(["lineage", "no-such-record", "--root", str(root)]) == 2
    assert "not in" in capsys.readouterr().err


def test_same_inputs_give_identical_files_and_a_changed_held_out_set_a_new_version(sample_root):
    root, _ = sample_root
    _held_out(root)
    first = data_engine.curate(root)
    corpus_bytes = (root / "curated_corpus" / CORPUS_FILE).read_bytes()
    again = data_engine.curate(root)
    assert again.version.id == first.version.id == data_engine.corpus_version(root)
    assert (root / "curated_corpus" / CORPUS_FILE).read_bytes() == corpus_bytes
    extra = root / "held_out" / "more.jsonl"
    extra.write_text(json.dumps({"id": "m1", "prompt": "an extra held-out question about fruit salads"}) + "\n")
    _held_out(root)
    assert data_engine.curate(root).version.id != first.version.id


def test_new_batch_is_checked_against_stored_signatures_without_recomputing_them(sample_root):
    root, batch_ids = sample_root
    _held_out(root)
    params = data_engine.DedupParams()
    for batch_id in batch_ids:
        staged.write_partition_signatures(batch_id, params, root)
    stored = {b: (staged.partition_dir(b, root) / staged.SIGNATURES_FILE).stat().st_mtime_ns for b in batch_ids}
    # a third batch re-logs a batch-1 trace with one word changed: a cross-batch near duplicate
    row = next(ingest.load_traces([batch_ids[0]], root))  # a plain trace dict, as read back (no re-validation)
    row["trace_id"] += "-copy"
    row["messages"][-1]["content"] = row["messages"][-1]["content"].replace("answer", "result", 1) + " Done."
    (root / "inbox" / "traces-0003.jsonl.gz").write_bytes(gzip.compress((json.dumps(row) + "\n").encode(), mtime=0))
    (new_batch,) = ingest_inbox(root)
    staged.write_partition_signatures(new_batch, params, root)
    report = data_engine.curate(root)
    assert {b: (staged.partition_dir(b, root) / staged.SIGNATURES_FILE).stat().st_mtime_ns for b in batch_ids} == stored
    assert report.store_report["computed"] == 0 and set(report.store_report["partitions"].values()) == {"stored"}
    info = data_engine.lineage(row["trace_id"], root)
    assert info["kept"] is False and info["cluster"]["representative"] != row["trace_id"]
    assert info["batch_id"] == new_batch  # the old batch's record stands for the new one


def test_stale_signatures_are_recomputed_not_trusted(sample_root):
    root, batch_ids = sample_root
    _held_out(root)
    staged.write_partition_signatures(batch_ids[0], data_engine.DedupParams(ngram=3), root)
    report = data_engine.curate(root)  # default ngram 5: the stored ngram-3 signatures do not apply
    assert "need" in report.store_report["partitions"][batch_ids[0]]
    assert report.store_report["from_store"] == 0


def test_cli_dedup_and_decontaminate_files(tmp_path, capsys):
    docs = tmp_path / "docs.jsonl"
    text = "one two three four five six seven eight nine ten eleven twelve thirteen fourteen"
    docs.write_text("".join(json.dumps(r) + "\n" for r in [
        {"id": "a", "text": text}, {"id": "b", "text": text + " fifteen"}, {"id": "c", "text": "other words entirely here"}]))
    out = tmp_path / "kept.jsonl"
    assert cli(["dedup", str(docs), "--out", str(out), "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["clusters"] == {"a": ["a", "b"]}
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == ["a", "c"]
    held = tmp_path / "eval.jsonl"
    held.write_text(json.dumps({"id": "e1", "prompt": text}) + "\n")
    assert cli(["decontaminate", str(docs), "--held-out", str(held), "--json"]) == 0
    dropped = json.loads(capsys.readouterr().out)["dropped"]
    assert {d["id"] for d in dropped} == {"a", "b"} and all("eval/e1" in d["detail"] for d in dropped)
    assert cli(["dedup", str(tmp_path / "missing.jsonl")]) == 2


def test_cli_curate_on_the_sample_root(sample_root, capsys):
    root, _ = sample_root
    assert cli(["curate", "--root", str(root), "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["drop_reasons"]["decontaminate/held_out_overlap"] == 2
    assert payload["dataset_version"] == data_engine.corpus_version(root)


@pytest.mark.parametrize("missing", ["held_out_sets", "curated_corpus"])
def test_missing_upstream_is_reported_with_the_fix(data_root, missing):
    sample_traces.write_samples(data_root)
    if missing == "held_out_sets":
        with pytest.raises(FileNotFoundError, match="materialise held_out_sets first"):
            data_engine.curate(data_root)
    else:
        with pytest.raises(FileNotFoundError, match="materialise curated_corpus first"):
            data_engine.load_curated_corpus(data_root)
