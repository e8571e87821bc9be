"""A data root with the sample traces ingested (both batches) and the held-out set written."""

import pytest

from training_assets import inbox, ingest, sample_traces


def ingest_inbox(root):
    """Stage and write every new inbox batch, as the sensor + raw_traces asset would; returns batch ids."""
    scan = inbox.scan_inbox(known_batch_ids=ingest.materialized_batches(root), root=root)
    for batch in scan.new:
        ingest.ingest_batch(batch.batch_id, root)
    return [b.batch_id for b in scan.new]


@pytest.fixture
def sample_root(data_root):
    sample_traces.write_samples(data_root)
    batch_ids = ingest_inbox(data_root)
    return data_root, batch_ids
