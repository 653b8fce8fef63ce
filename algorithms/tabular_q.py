"""Tabular Q-learning for a population of independent agents on a grid world.

Each agent has its own Q-table and its own env; one update moves every agent
`steps_per_update` steps.
Terminal transitions do not bootstrap; time-limit truncations bootstrap from the final cell.
"""
import dataclasses
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from lightspeed.algorithms.common.exploration import epsilon_greedy, greedy_with_random_ties
from lightspeed.algorithms.common.grid_plot import plot_grid_values
from lightspeed.framework.core.algorithm import Algorithm
from lightspeed.framework.core.env import EpisodeStatistics
from lightspeed.framework.core.errors import check_number, check_positive_int
from lightspeed.framework.core.evaluation import make_record_episode
from lightspeed.framework.core.registry import register_algorithm


@dataclasses.dataclass
class TabularQConfig:
    """Tabular Q-learning's keys and their defaults: what `algo=tabular_q` runs."""

    name: str = "tabular_q"  # the registered name of the algorithm that algo=tabular_q chooses
    num_agents: int = 30  # independent learners, each with its own table and env (the seed article's 30 in parallel)
    steps_per_update: int = 32  # steps per agent per update; their random numbers come in one draw
    learning_rate: float = 0.1  # step size (alpha) of each Q-table update
    discount: float = 0.9  # per-step discount (gamma)
    epsilon: float = 0.1  # chance of a random action while training (evaluation acts greedily)
    initial_q: float = 0.0  # every Q-table entry at the start

    def validate(self) -> None:
        check_positive_int("algo.num_agents", self.num_agents)
        check_positive_int("algo.steps_per_update", self.steps_per_update)
        check_number("algo.learning_rate", self.learning_rate, 0, 1, low_inclusive=False)
        check_number("algo.discount", self.discount, 0, 1)
        check_number("algo.epsilon", self.epsilon, 0, 1)
        check_number("algo.initial_q", self.initial_q)


@struct.dataclass
class TabularQState:
    q_values: jax.Array  # [agents, height, width, actions]
    obs: jax.Array  # [agents, 2] current cell of each agent
    env_state: Any
    key: jax.Array


def cell_values(q_values: jax.Array, cells: jax.Array) -> jax.Array:
    """Q-values of each agent at its cell: [agents, H, W, A] x [agents, 2] -> [agents, A]."""
    agents = jnp.arange(q_values.shape[0])
    return q_values[agents, cells[:, 0], cells[:, 1]]


def q_learning_targets(reward: jax.Array, terminated: jax.Array, next_values: jax.Array, discount: float) -> jax.Array:
    """r + discount * max_a Q(s', a), without the bootstrap where the episode truly ended."""
    return reward + discount * jnp.where(terminated, 0.0, next_values.max(axis=-1))


def greedy_paths(env: Any, env_params: Any, algorithm: Any, q_values: jax.Array) -> list[list[tuple[int, int]]]:
    """The cells each agent's own greedy policy visits in one episode ([agents, H, W, A] tables), played
    as framework.tools.evaluate plays it (the same act, ties broken at random)."""
    record = jax.vmap(make_record_episode(env, env_params, algorithm))
    members = q_values[:, None]  # one agent's table alone acts as the whole population does
    states, _, steps = jax.jit(record)(members, jax.random.split(jax.random.key(0), q_values.shape[0]))
    cells, steps = np.asarray(states.cell), np.asarray(steps)
    return [[tuple(int(v) for v in cell) for cell in cells[agent, : steps[agent] + 1]] for agent in range(len(steps))]


@register_algorithm("tabular_q", config=TabularQConfig, consumes=("cell",))  # it indexes its tables by grid cell
def make_tabular_q(config: TabularQConfig, env: Any, env_params: Any) -> Algorithm:
    height, width = env.grid_shape
    num_agents, num_actions = config.num_agents, env.num_actions
    stats_env = EpisodeStatistics(env)
    step_envs = jax.vmap(stats_env.step, in_axes=(0, 0, 0, None))

    def init(key: jax.Array) -> TabularQState:
        key, reset_key = jax.random.split(key)
        reset_all = jax.vmap(stats_env.reset, in_axes=(0, None))
        obs, env_state = reset_all(jax.random.split(reset_key, num_agents), env_params)
        q_values = jnp.full((num_agents, height, width, num_actions), config.initial_q, jnp.float32)
        return TabularQState(q_values, obs, env_state, key)

    def agent_step(carry: tuple, randomness: tuple) -> tuple[tuple, None]:
        """Every agent acts, steps its env and updates its table once."""
        q_values, obs, env_state = carry
        uniforms, env_keys = randomness
        actions = epsilon_greedy(cell_values(q_values, obs), config.epsilon, uniforms)
        next_obs, env_state, reward, terminated, _, info = step_envs(env_keys, env_state, actions, env_params)
        next_values = cell_values(q_values, info["final_observation"])
        targets = q_learning_targets(reward, terminated, next_values, config.discount)
        index = (jnp.arange(num_agents), obs[:, 0], obs[:, 1], actions)
        td_errors = targets - q_values[index]
        q_values = q_values.at[index].add(config.learning_rate * td_errors)
        return (q_values, next_obs, env_state), None

    def update(state: TabularQState) -> tuple[TabularQState, dict]:
        key, uniform_key, env_key = jax.random.split(state.key, 3)
        # one bulk draw for all steps of the update: per-step draws cost more than the step itself
        uniforms = jax.random.uniform(uniform_key, (config.steps_per_update, num_agents))
        env_keys = jax.random.split(env_key, (config.steps_per_update, num_agents))  # dropped by XLA if unused
        carry = (state.q_values, state.obs, state.env_state)
        (q_values, obs, env_state), _ = jax.lax.scan(agent_step, carry, (uniforms, env_keys))
        metrics = {
            "train/episode_return": env_state.returned_episode_return.mean(),
            "train/episode_length": env_state.returned_episode_length.mean(),
            # a per-step TD-error sum here would cost 10x the step (XLA then copies the table)
            "train/mean_max_q": q_values.max(axis=-1).mean(),
        }
        return TabularQState(q_values, obs, env_state, key), metrics

    def policy(state: TabularQState) -> jax.Array:
        return state.q_values

    def act_init(episode: jax.Array) -> jax.Array:
        return episode  # episode e follows agent e mod the population's size, so every agent is scored

    def act(q_values: jax.Array, episode: jax.Array, obs: jax.Array, start: jax.Array, key: jax.Array
            ) -> tuple[jax.Array, jax.Array]:
        values = q_values[episode % q_values.shape[0], obs[0], obs[1]]
        return greedy_with_random_ties(values, jax.random.uniform(key)), episode

    def save_artifacts(states: TabularQState, run_dir: Path) -> None:
        q_table = np.asarray(states.q_values)  # [seeds, agents, H, W, A]
        np.save(run_dir / "q_table.npy", q_table)
        paths = greedy_paths(env, env_params, algorithm, jnp.asarray(q_table[0]))
        plot_grid_values(q_table[0, 0].max(axis=-1), run_dir / "q_values.png", np.asarray(env.walls), paths[0],
                         np.asarray(env_params.start), np.asarray(env_params.goal),
                         "seed 0, agent 0: max Q and greedy path (other agents thin)",
                         other_paths=paths[1:])

    algorithm = Algorithm(init, update, policy, act, env_steps_per_update=num_agents * config.steps_per_update,
                          act_init=act_init, save_artifacts=save_artifacts, population_policy=True,
                          headline_metrics=(("train/episode_return", "train return"),))
    return algorithm
