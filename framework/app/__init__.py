"""The application: the command-line checks, Hydra's app (run.py and the `lightspeed` command) and the dispatch of
a composed config to the driver of its shape."""
