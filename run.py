"""Entry point: `python run.py algo=tabular_q env=gridworld num_seeds=4` (Hydra overrides); the installed
`lightspeed` command runs the same app (framework/app/main.py)."""
import time

LAUNCH_TIME = time.time()  # before the heavy imports, so solve times count them

import gc  # noqa: E402

# Imports, config composition and tracing allocate objects that live all run; the collector's
# scans of them cost ~0.3 s of startup. The trainer freezes them and re-enables it once compiled.
gc.disable()

from lightspeed.framework.app.main import main  # noqa: E402

if __name__ == "__main__":
    main(LAUNCH_TIME)
