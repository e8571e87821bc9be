"""The agent harness: a served model acting on tasks with real tools, every attempt written as a trace.

    client = chat_client("http://127.0.0.1:8000/v1")
    report = run_tasks(client, "smollm2-v3", load_tasks(HELD_OUT_TASKS), generation=1)
    write_batch(report.traces, paths.inbox_dir(), "harness-g1")

Pure library (no dagster, no torch): ``tasks`` (the task file anyone can bring), ``tools`` (the
tool registry the model calls), ``scoring`` (strict answers), ``families`` (the built-in task
pools), ``teacher`` (ideal conversations), ``client`` (the OpenAI client, no redirects),
``runner`` (attempts, reports, inbox batches) and ``stats`` (bootstrap intervals).
"""
