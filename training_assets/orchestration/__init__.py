"""Talking to a Dagster instance from outside its code location: launching runs and reading them back.

    backend = LocalRuns()                                  # backends.py: $DAGSTER_HOME, a detached worker per run
    backend = GraphQLRuns("http://127.0.0.1:3000")         # graphql.py: a running dagster-webserver
    python -m training_assets.orchestration.local_runs RUN_ID         # the run worker LocalRuns starts

``training_assets/defs/`` holds the Dagster definitions (assets, checks, sensors, jobs, resources)
and nothing else; this package is their one client: the agent surface (``training_assets.agent``)
and the CLI reach an instance only through it (the agent's workflow driver,
``agent/workflow_driver.py``, launches and reads its stages' runs through the backends here, so
the arrow points one way: agent -> orchestration). Besides ``defs/`` it is the only package that
imports dagster (``tests/test_definitions.py`` enforces both rules). Modules:

- ``vocabulary.py``: the run tags and run statuses every module here (and the agent) shares;
- ``backends.py``: the ``RunBackend`` protocol and ``LocalRuns`` (imports dagster only when first
  used, so the MCP server starts without it);
- ``graphql.py``: ``GraphQLRuns``, the same protocol through a webserver's GraphQL API;
- ``catalog.py``: the asset graph and each asset's state, read from the Definitions and the instance;
- ``local_runs.py``: create, execute, read and cancel runs on the local instance (the run worker);
- ``active_runs.py``: which assets queued or running runs may be writing (``training-assets gc``);
- ``demo.py``: ``make demo``, every asset on the sample traces.

Why a run worker of our own beside Dagster's run queue: see ``local_runs.py`` (no daemon drains the
queue of the embedded instance). Everything it does, it does through the instance, so the UI, the
daemon's run monitoring and ``--dagster-url`` see the same runs.
"""
