"""Partitions shared across stages."""

import dagster as dg

# One partition per trace batch; keys are "<file stem>-<content sha256[:12]>", added by the sensor.
trace_batches = dg.DynamicPartitionsDefinition(name="trace_batches")
