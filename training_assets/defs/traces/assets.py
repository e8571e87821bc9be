"""raw_traces: one partition per trace batch, staged and validated into Parquet plus a quarantine."""

import dagster as dg
from pydantic import Field

from training_assets import ingest
from training_assets.defs.metadata import counts_table, table
from training_assets.defs.partitions import trace_batches
from training_assets.defs.resources import DataRoot
from training_assets.traces import (
    DEFAULT_MAX_BATCH_BYTES,
    DEFAULT_MAX_BATCH_LINES,
    DEFAULT_MAX_LINE_BYTES,
    BatchCaps,
    check_batch_id,
)

QUARANTINE_CHECK = "quarantine_rate_within_limit"


class RawTracesConfig(dg.Config):
    max_line_bytes: int = Field(DEFAULT_MAX_LINE_BYTES, ge=1, description="Lines longer than this are quarantined.")
    max_batch_bytes: int = Field(DEFAULT_MAX_BATCH_BYTES, ge=1,
                                 description="A batch with more decompressed bytes fails (BatchError); nothing is written.")
    max_batch_lines: int = Field(DEFAULT_MAX_BATCH_LINES, ge=1,
                                 description="A batch with more lines fails (BatchError); nothing is written.")
    max_quarantine_rate: float = Field(
        0.25, ge=0.0, le=1.0, description="Blocking check: the share of lines quarantined must not exceed this."
    )

    def caps(self) -> BatchCaps:
        return BatchCaps(self.max_line_bytes, self.max_batch_bytes, self.max_batch_lines)


@dg.asset(
    partitions_def=trace_batches,
    group_name="traces",
    code_version=ingest.INGEST_VERSION,
    kinds={"parquet"},
    # Partitioned like the asset: each batch's check result is its own, so the automation of one
    # batch's signatures never reads another batch's result.
    check_specs=[dg.AssetCheckSpec(QUARANTINE_CHECK, asset="raw_traces", blocking=True, partitions_def=trace_batches,
                                   description="Share of quarantined lines is within max_quarantine_rate.")],
)
def raw_traces(context: dg.AssetExecutionContext, config: RawTracesConfig, data_root: DataRoot) -> dg.MaterializeResult:
    """Validated traces of one inbox batch (Parquet) and its quarantined lines (JSONL, with reasons).

    The run stages the inbox file first (sha256 + immutable copy under ``batches/``).
    """
    batch_id = check_batch_id(context.partition_key)
    report = ingest.ingest_batch(batch_id, data_root.root(), config.caps())
    context.log.info(f"{batch_id}: {report.lines} lines, {report.valid} valid, {report.quarantined} quarantined "
                     f"{report.reasons}" + (f"; same content as {report.duplicate_of}: nothing new" if report.duplicate_of else ""))
    rate = report.quarantine_rate
    return dg.MaterializeResult(
        metadata={
            "lines": report.lines,
            "valid": report.valid,
            "quarantined": report.quarantined,
            "quarantine_rate": rate,
            "duplicate_of": report.duplicate_of or "",
            "quarantined_by_reason": counts_table(report.reasons),
            "preview": table(report.preview),
            "dagster/row_count": report.valid,
            "uri": dg.MetadataValue.path(str(report.output_dir)),
        },
        data_version=dg.DataVersion(report.data_version),
        check_results=[dg.AssetCheckResult(
            check_name=QUARANTINE_CHECK,
            passed=rate <= config.max_quarantine_rate,
            severity=dg.AssetCheckSeverity.ERROR,
            metadata={"quarantine_rate": rate, "max_quarantine_rate": config.max_quarantine_rate,
                      "reasons": counts_table(report.reasons)},
            description=None if rate <= config.max_quarantine_rate else (
                f"{report.quarantined}/{report.lines} lines quarantined ({rate:.1%}) > "
                f"{config.max_quarantine_rate:.1%}; see {report.output_dir / ingest.QUARANTINE_FILE}"),
        )],
    )
