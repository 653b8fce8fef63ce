"""The algorithm contract: pure functions of one seed's state, closed over config and env."""
from pathlib import Path
from typing import Any, Callable, NamedTuple, Optional

import jax

Metrics = dict[str, jax.Array]


class Algorithm(NamedTuple):
    # key -> the training state of one seed; the trainer vmaps it over seeds.
    init: Callable[[jax.Array], Any]
    # One training iteration (act, step the envs, learn); jittable, no host work.
    update: Callable[[Any], tuple[Any, Metrics]]
    # The part of a seed's state its greedy policy reads (network parameters, a Q-table): what
    # evaluation plays, what the best policy keeps and what a saved policy holds.
    policy: Callable[[Any], Any]
    # Greedy actions for a batch of evaluation episodes: (policy, obs[E, ...], key) -> actions[E].
    act: Callable[[Any, jax.Array, jax.Array], jax.Array]
    # Env transitions one `update` makes in one seed (all of its envs together).
    env_steps_per_update: int
    # True: the policy holds a population along the leading axis of every leaf (tabular Q's agents);
    # `act` spreads a batch over its members (row e: member e mod size), so one member alone acts too.
    population_policy: bool = False
    # Optional host-side outputs from the final states of all seeds, e.g. tables and plots.
    save_artifacts: Optional[Callable[[Any, Path], None]] = None
    # True: one learner per device averaging gradients with framework.parallel.mean_over_devices;
    # init and update then run inside the device axis (framework.parallel.device_index works).
    parallel_learners: bool = False
    # Cumulative metrics (e.g. "learner/updates") the trainer also logs as "<name>_per_second".
    counters: tuple[str, ...] = ()
    # Metrics that must stay finite (loss, Q-values) once the metric `learner_steps` is > 0:
    # before learning starts they may be NaN ("not yet"). Checked per seed with `nan_policy`.
    health_metrics: tuple[str, ...] = ()
    learner_steps: Optional[str] = None
    # Optional metrics of a seed's state alone (state -> metrics), computed once per chunk from its
    # final state instead of after every update: for statistics over big arrays, e.g. the replay.
    state_metrics: Optional[Callable[[Any], Metrics]] = None
