"""What every run does whatever its shape: the run dir, evaluation protocol and best policies, logging, progress,
checkpoints, saved policies, plots, resource checks and the run's closing lines."""
