"""The agent surface: an MCP server with the platform's tools, four personas and the train_model workflow.

    training-assets mcp [--persona NAME] [--dagster-url URL]          # serve the tools (stdio)
    training-assets workflow run train_model [--execute]               # the workflow from the shell
    training-assets agent run train_model --model-url URL              # an LLM drives the four personas

A face of the platform beside ``commands/``: it calls the library and launches Dagster runs of the
asset graph (through ``training_assets.orchestration``, which with ``defs/`` alone imports dagster),
and the library never imports it. ``server.py`` builds the server, ``tools/`` holds the tools by
area, ``graph_map.py`` maps a tool's config onto assets and run config, ``runs.py`` picks the run
backend and reads a run into a report, ``workflow.py`` / ``workflow_driver.py`` plan and execute
the workflow (its runs through ``orchestration``'s backends), ``driver.py`` is the
OpenAI-compatible agent loop; personas, the workflow and the Agent Skill are data files.
"""
