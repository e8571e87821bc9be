"""Run several training job specs, in order, in one fresh process (``python _run_jobs.py JOB.json ...``).

The determinism tests start this with different ``PYTHONHASHSEED`` values: anything that depends
on Python's per-process string-hash salt (set iteration order) then shows up as different bytes.
"""

import json
import sys
from pathlib import Path

from training_assets.trainers.accelerate_launch import run_job

for path in sys.argv[1:]:
    run_job(json.loads(Path(path).read_text()))
