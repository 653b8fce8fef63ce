"""A run from a composed config: validate, build the env and algorithm, then hand them to the driver of their
shape: the single program (framework/anakin) for a JAX env, actors and learner apart (framework/sebulba) for
an env stepped on the host."""
import re
import time
from pathlib import Path
from typing import Optional

from omegaconf import DictConfig

from lightspeed.framework.anakin.trainer import train_single_program
from lightspeed.framework.app.cli import tuned_ids
from lightspeed.framework.core import registry
from lightspeed.framework.core.config import CONF_DIR, validated
from lightspeed.framework.core.devices import check_num_devices, initialize_distributed, jax_options
from lightspeed.framework.run.progress import print_line, run_log
from lightspeed.framework.sebulba.trainer import train_host


def applied_settings_line(algo_env: Optional[str], env_id: Optional[str] = None) -> Optional[str]:
    """The run's first line: which conf/algo_env file retuned the algorithm for this env, what its first comment
    says it is, and how to leave it out (and, where the file names the ids it was tuned for and the run's is not
    among them, that too); None where the optional file does not exist (or was left out)."""
    path = CONF_DIR / "algo_env" / f"{algo_env}.yaml"
    if not algo_env or not path.is_file():
        return None
    comments = [line[2:] for line in path.read_text().splitlines() if line.startswith("# ") and "@package" not in line]
    what = re.split(r":| \(|,", comments[0], maxsplit=1)[0].strip() if comments else algo_env
    ids = tuned_ids(algo_env)
    untuned = f", tuned for {', '.join(ids)}, not {env_id}" if ids and env_id not in ids else ""
    return f"settings: conf/algo_env/{algo_env}.yaml, {what}{untuned} (~algo_env leaves them out)"


def train(cfg: DictConfig, run_dir: Path, launch_time: Optional[float] = None,
          sweep_group: Optional[str] = None, algo_env: Optional[str] = None,
          settings_note: Optional[str] = None) -> dict:
    """Validate, build, compile and run; write metrics, summary, plots, policies and checkpoints into `run_dir`.
    `algo_env` names the conf/algo_env file the config applied, said at the start (or `settings_note`: why none
    was). Returns the run's summary (what summary.json holds)."""
    launch_time = time.time() if launch_time is None else launch_time
    seconds = lambda: time.time() - launch_time
    train_cfg = validated(cfg)
    initialize_distributed(train_cfg.distributed)
    check_num_devices(train_cfg.num_devices)
    with jax_options(train_cfg.compilation_cache, train_cfg.matmul_precision), run_log(run_dir):
        if settings := settings_note or applied_settings_line(algo_env, cfg.env.get("id")):
            print_line(settings)
        env, env_params, algorithm = registry.build(train_cfg.env, train_cfg.algo)
        if getattr(env, "host", False):  # stepped in Python: actors and learner apart
            return train_host(train_cfg, cfg, env, algorithm, run_dir, seconds, sweep_group)
        return train_single_program(train_cfg, cfg, env, env_params, algorithm, run_dir, seconds, sweep_group)
