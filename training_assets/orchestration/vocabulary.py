"""The run tags and run statuses every module that launches or reads runs shares, in Dagster's words.

    {LAUNCHED_BY_TAG: "mcp:ml_orchestrator", WORKFLOW_TAG: "wf-…", STAGE_TAG: "train"}   # tags on a run
    run["status"] in TERMINAL                                                          # finished

Plain strings, no imports: the agent surface, both run backends, the run worker and the workflow
driver read them from here, so a name is written once and nothing here pulls in dagster.
"""

LAUNCHED_BY_TAG = "training_assets/launched_by"
PLANNED_STEPS_TAG = "training_assets/planned_steps"  # JSON {asset: planned optimizer steps}, for progress
WORKFLOW_TAG = "training_assets/workflow"
STAGE_TAG = "training_assets/stage"
PARTITION_TAG = "dagster/partition"
# DagsterRunStatus values: a run still to finish (or to be canceled), and a finished one.
IN_FLIGHT = ("QUEUED", "NOT_STARTED", "STARTING", "STARTED", "CANCELING")
TERMINAL = ("SUCCESS", "FAILURE", "CANCELED")
