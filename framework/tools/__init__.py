"""Tools over finished runs: `python -m framework.tools.evaluate RUN_DIR` plays saved policies,
`python -m framework.tools.report PATH` aggregates runs."""
