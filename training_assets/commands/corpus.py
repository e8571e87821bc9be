"""Verbs: ``curate``, ``dedup``, ``decontaminate``, ``lineage``.

    training-assets curate --json                       # whole pipeline over $TRAINING_ASSETS_DATA
    training-assets curate --engine ray --ray-address 127.0.0.1:6379   # the same, on a Ray cluster
    training-assets dedup docs.jsonl --threshold 0.8 --out kept.jsonl
    training-assets dedup docs.jsonl --engine ray       # the same on the Ray cluster at $RAY_ADDRESS
    training-assets decontaminate docs.jsonl --held-out data/held_out/agent_tasks.jsonl --decontam-ngram 8
    training-assets lineage units-0001-a91               # why a record was kept or dropped

The options that set a curation setting are derived from its one declaration
(``data_engine.CurationConfig``, ``QualityConfig``, ``HeldOutConfig``; ``commands._options``): the
same names, defaults and help as the ``curated_corpus`` run config. The dedup method and shingling
take ``DedupParams``'s defaults; ``--extra`` and ``--held-out`` list files.
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
from pathlib import Path

from training_assets import data_engine, paths
from training_assets.commands import emit, fail
from training_assets.commands._options import add_model_options, model_from_args
from training_assets.data_engine.corpus import RUN_ONLY_FIELDS, HeldOutConfig
from training_assets.data_engine.dedup import METHODS
from training_assets.settings import fields_model

DEDUP_DEFAULTS = {f.name: f.default for f in dataclasses.fields(data_engine.DedupParams)}
# what each verb lets users set of CurationConfig (curate: the quality thresholds too, all of them)
CURATE_FIELDS = fields_model(data_engine.CurationConfig, ("decontam_ngram", "decontam_min_ngram", *RUN_ONLY_FIELDS))
DEDUP_FIELDS = fields_model(data_engine.CurationConfig, ("engine", "ray_address"))
DECONTAM_FIELDS = fields_model(data_engine.CurationConfig, ("decontam_ngram", "decontam_min_ngram"))
from training_assets.storage import atomic_path, write_jsonl


def _read(source: str) -> list[dict]:
    return list(data_engine.stream_corpus(source))


def _write_records(out: str | None, records: list[dict]) -> None:
    if out:
        with atomic_path(out) as tmp:
            write_jsonl(tmp, records)


def _curate(args: argparse.Namespace) -> int:
    root = paths.data_root(args.root)
    try:
        held = sorted(glob.glob(str(root / "held_out" / "*.jsonl")))
        if held:  # index the held-out files as the held_out_sets asset would
            data_engine.write_held_out_sets(held, root)
        config = data_engine.CurationConfig(
            quality=model_from_args(data_engine.QualityConfig, args), dedup=_dedup_params(args),
            extra_sources=tuple(args.extra), **model_from_args(CURATE_FIELDS, args).model_dump())
        report = data_engine.curate(root, config)
    except (ValueError, FileNotFoundError, ImportError) as exc:
        return fail(str(exc))
    payload = {"dataset_version": report.version.id, "output_dir": str(report.output_dir),
               "stage_counts": report.stage_counts, "drop_reasons": report.drop_reasons,
               "cluster_sizes": report.cluster_sizes, "dedup": report.dedup_stats, "signatures": report.store_report,
               "residual_overlaps": report.residual_overlaps, "engine": config.engine}
    if report.engine_info:
        payload["ray"] = report.engine_info
    text = [f"curated corpus {report.version.id} -> {report.output_dir}",
            "  " + " -> ".join(f"{k} {v}" for k, v in report.stage_counts.items())]
    text += [f"  dropped {reason}: {n}" for reason, n in report.drop_reasons.items()]
    emit(args, payload, "\n".join(text))
    return 0


def _dedup(args: argparse.Namespace) -> int:
    try:
        where = model_from_args(DEDUP_FIELDS, args)
        records = _read(args.file)
        result = data_engine.dedup(records, args.method, args.threshold, args.num_perm, args.ngram, args.seed,
                                   engine=where.engine, ray_address=where.ray_address)
    except (ValueError, ImportError) as exc:
        return fail(str(exc))
    _write_records(args.out, result.kept)
    multi = {k: v for k, v in result.clusters.items() if len(v) > 1}
    payload = {"stats": result.stats, "clusters": multi, "dropped": [d.to_dict() for d in result.dropped]}
    text = [f"{args.file}: {result.stats['input']} records, kept {result.stats['kept']} "
            f"({result.stats['exact_duplicates']} exact, {result.stats['near_duplicates']} near duplicates removed)"]
    text += [f"  {rep} stands for {', '.join(members[1:])}" for rep, members in list(multi.items())[:20]]
    emit(args, payload, "\n".join(text))
    return 0


def _decontaminate(args: argparse.Namespace) -> int:
    try:
        ngrams = model_from_args(DECONTAM_FIELDS, args)
        records = _read(args.file)
        held = data_engine.load_held_out(args.held_out, args.fields)
        result = data_engine.decontaminate(records, held, ngram=ngrams.decontam_ngram,
                                           min_ngram=ngrams.decontam_min_ngram)
    except ValueError as exc:
        return fail(str(exc))
    _write_records(args.out, result.kept)
    payload = {"stats": result.stats, "dropped": [d.to_dict() for d in result.dropped]}
    text = [f"{args.file}: {len(records)} records, {len(result.dropped)} dropped for held-out overlap"]
    text += [f"  {d.id}: {d.detail}" for d in result.dropped[:50]]
    emit(args, payload, "\n".join(text))
    return 0


def _lineage(args: argparse.Namespace) -> int:
    try:
        row = data_engine.lineage(args.record_id, paths.data_root(args.root))
    except (KeyError, FileNotFoundError) as exc:
        return fail(str(exc.args[0] if isinstance(exc, KeyError) else exc))
    verdict = "kept" if row["kept"] else f"dropped at {row['stage']}: {row['reason']}"
    text = [f"{row['id']} ({row['source']}, batch {row['batch_id']}): {verdict}", f"  {row['detail']}"]
    if row.get("duplicate_of"):
        text.append(f"  duplicate of {row['duplicate_of']}")
    if row.get("cluster") and len(row["cluster"]["members"]) > 1:
        text.append(f"  cluster of {row['cluster']['representative']}: {', '.join(row['cluster']['members'])}")
    emit(args, row, "\n".join(text))
    return 0


def _dedup_params(args: argparse.Namespace) -> data_engine.DedupParams:
    return data_engine.DedupParams(args.method, args.threshold, args.num_perm, args.ngram, args.seed)


def _dedup_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--method", choices=METHODS, default=DEDUP_DEFAULTS["method"],
                   help="near-duplicate similarity")
    p.add_argument("--threshold", type=float, default=DEDUP_DEFAULTS["threshold"],
                   help="similarity at or above which records are duplicates")
    p.add_argument("--num-perm", type=int, default=DEDUP_DEFAULTS["num_perm"], help="MinHash permutations / hyperplane bits")
    p.add_argument("--ngram", type=int, default=DEDUP_DEFAULTS["ngram"], help="words per shingle")
    p.add_argument("--seed", type=int, default=DEDUP_DEFAULTS["seed"], help="seed of permutations and hyperplanes")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("curate", help="curate every trace partition (+ extra sources) into the corpus")
    p.add_argument("--root", help="data root (default $TRAINING_ASSETS_DATA or ./data)")
    p.add_argument("--extra", nargs="*", default=[], help="extra .jsonl/.txt/.parquet sources")
    _dedup_options(p)
    add_model_options(p, data_engine.QualityConfig)
    add_model_options(p, CURATE_FIELDS)
    p.add_argument("--json", action="store_true", help="machine-readable report")
    p.set_defaults(handler=_curate)

    p = subparsers.add_parser("dedup", help="remove exact and near duplicates from a .jsonl/.txt/.parquet file")
    p.add_argument("file", help="records: JSONL with id/text, text blocks, or Parquet with a text column")
    p.add_argument("--out", help="write kept records here as JSONL")
    _dedup_options(p)
    add_model_options(p, DEDUP_FIELDS)
    p.add_argument("--json", action="store_true", help="machine-readable report with clusters and drop reasons")
    p.set_defaults(handler=_dedup)

    p = subparsers.add_parser("decontaminate", help="drop records sharing an n-gram with held-out eval examples")
    p.add_argument("file", help="records: JSONL with id/text, text blocks, or Parquet with a text column")
    p.add_argument("--held-out", nargs="+", required=True, type=Path, help="held-out JSONL files (rows with id + fields)")
    fields = HeldOutConfig.model_fields["fields"]
    p.add_argument("--fields", nargs="+", default=list(fields.default), help=fields.description)
    add_model_options(p, DECONTAM_FIELDS)
    p.add_argument("--out", help="write kept records here as JSONL")
    p.add_argument("--json", action="store_true", help="machine-readable report")
    p.set_defaults(handler=_decontaminate)

    p = subparsers.add_parser("lineage", help="why a record was kept or dropped (and duplicate of what)")
    p.add_argument("record_id", help="record id: a trace id, or <source>:<n> for extra sources")
    p.add_argument("--root", help="data root (default $TRAINING_ASSETS_DATA or ./data)")
    p.add_argument("--json", action="store_true", help="machine-readable answer")
    p.set_defaults(handler=_lineage)
