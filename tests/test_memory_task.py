"""A memory task of a user's own (issue 41): a cue shown once, a delay, a choice. R2D2 learns it to its optimum
(return 1) while feed-forward DQN stays at chance (0.5): the choice step looks the same whatever the cue was, so a
policy without memory cannot do better than guess.

The env is written here as a user would write a plugin: an Environment subclass registered under a test-only name,
with its config dataclass; both algorithms train on it in-process through the same `train` run.py calls.
"""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from conftest import compose_config
from flax import struct

from lightspeed.framework.app.train import train
from lightspeed.framework.core.env import Environment, StepResult
from lightspeed.framework.core.errors import check, check_positive_int
from lightspeed.framework.core.registry import register_env

MAX_DELAY = 1000  # a bound a user would give: episodes stay short enough to evaluate


@dataclasses.dataclass
class CueDelayChoiceConfig:
    name: str = "cue_delay_choice"
    delay: int = 4  # blank steps between the cue and the choice

    def validate(self) -> None:
        check_positive_int("env.delay", self.delay, minimum=0)
        check(self.delay <= MAX_DELAY, "env.delay", self.delay, f"an integer from 0 to {MAX_DELAY}")


@struct.dataclass
class CueDelayChoiceParams:
    delay: int = 4


@struct.dataclass
class CueDelayChoiceState:
    cue: jax.Array  # 0 or 1, drawn at reset
    time: jax.Array  # steps taken in the episode


class CueDelayChoice(Environment):
    """Observations [cue is 0, cue is 1, choose now]: the cue at step 0, zeros for `delay` steps, then the choice
    step; the action taken there earns 1 if it names the cue and ends the episode. Earlier actions earn 0."""

    name = "cue_delay_choice"
    stochastic_transitions = False  # the cue is drawn at reset; step_env ignores its key

    @property
    def default_params(self) -> CueDelayChoiceParams:
        return CueDelayChoiceParams()

    @property
    def num_actions(self) -> int:
        return 2

    @property
    def observation_shape(self) -> tuple[int, ...]:
        return (3,)

    def max_episode_steps(self, params: CueDelayChoiceParams) -> int:
        return int(params.delay) + 2

    def reset_env(self, key: jax.Array, params: CueDelayChoiceParams) -> tuple[jax.Array, CueDelayChoiceState]:
        cue = jax.random.bernoulli(key).astype(jnp.int32)
        return jax.nn.one_hot(cue, 3), CueDelayChoiceState(cue, jnp.int32(0))

    def step_env(self, key: jax.Array, state: CueDelayChoiceState, action: jax.Array,
                 params: CueDelayChoiceParams) -> StepResult:
        choosing = state.time == params.delay + 1
        reward = jnp.where(choosing, (action == state.cue).astype(jnp.float32), 0.0)
        time = state.time + 1
        obs = jnp.where(time == params.delay + 1, jnp.float32(1.0), 0.0) * jnp.array([0.0, 0.0, 1.0])
        return obs, CueDelayChoiceState(state.cue, time), reward, choosing, jnp.bool_(False), {}


@register_env("cue_delay_choice", config=CueDelayChoiceConfig)
def make_cue_delay_choice(config: CueDelayChoiceConfig) -> tuple[CueDelayChoice, CueDelayChoiceParams]:
    return CueDelayChoice(), CueDelayChoiceParams(config.delay)


DELAY = 5  # episodes of 7 steps: they drift against the 8-step sequence period, so sequences start at every phase
SEED = 41
NUM_SEEDS = 3
RUN = ["env=cue_delay_choice", f"env.delay={DELAY}", f"seed={SEED}", f"num_seeds={NUM_SEEDS}",
       "total_env_steps=16384", "eval_every=16384", "log_every=4096", "eval_episodes=100", "final_eval_episodes=100"]
# 8 envs (2 actors x 4); a sequence of 4 burn-in + 16 trained steps every 8 steps holds two whole episodes; each
# 8-step rollout inserts 8 sequences and the learner draws 4 per inserted one (2 batches of 16)
R2D2 = ["algo=r2d2", "algo.num_actors=2", "algo.envs_per_actor=4", "algo.rollout_length=8", "algo.sequence_period=8",
        "algo.burn_in=4", "algo.sequence_length=16", "algo.batch_size=16", "algo.samples_per_insert=4",
        "algo.buffer_size=2048", "algo.learning_starts=64", "algo.lstm_size=32", "algo.hidden_sizes=[32]",
        "algo.target_update_period=50", "algo.learning_rate=1e-3"]
DQN = ["algo=dqn", "algo.hidden_sizes=[32]"]  # DQNConfig's defaults otherwise: it sees one observation at a time


def final_returns(overrides: list[str], run_dir) -> list[float]:
    summary = train(compose_config(*RUN, *overrides), run_dir)
    assert summary["final_eval_episodes"] == 100
    return [seed["final_eval_return"] for seed in summary["seeds"]]


def test_r2d2_remembers_the_cue_where_feed_forward_dqn_can_only_guess(tmp_path):
    r2d2 = final_returns(R2D2, tmp_path / "r2d2")
    dqn = final_returns(DQN, tmp_path / "dqn")
    assert len(r2d2) == len(dqn) == NUM_SEEDS
    assert all(final >= 0.95 for final in r2d2), f"R2D2 {r2d2}, DQN {dqn}"
    # A memoryless greedy policy takes one fixed action at the choice step (it looks the same whatever the cue), so
    # each seed's final is Binomial(100, 0.5) / 100: the mean over 3 seeds has sd 0.5 / sqrt(300) = 0.029, and
    # 0.35..0.65 lies over 5 sd from 0.5 (a chance of failing below 1e-6); one seed above 0.8 is 6 sd off.
    assert 0.35 <= np.mean(dqn) <= 0.65 and max(dqn) < 0.8, f"DQN {dqn}, R2D2 {r2d2}"
