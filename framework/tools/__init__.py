"""Tools over finished runs: `python -m lightspeed.framework.tools.evaluate RUN_DIR` plays saved policies,
`python -m lightspeed.framework.tools.report PATH` aggregates runs."""
