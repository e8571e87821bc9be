"""Dagster definitions only (with ``orchestration/``, the only packages that import dagster).

One folder per stage (``traces/``, ``corpus/``, ...), each with ``assets.py`` / ``checks.py`` /
``sensors.py``, loaded by ``dg.load_from_defs_folder`` (``training_assets/definitions.py``): a
new stage is a new folder and nothing else. Stage folders never import each other (they refer to
upstream assets by key); what they share is in ``resources.py``, ``partitions.py`` and
``metadata.py``.
"""
