"""Gymnasium ids of partially observed classic-control envs, registered when this module is imported: name them as
`env.id=lightspeed.envs.partially_observed:<id>` (gymnasium imports the module before making the env, in every worker
too).

- CartPolePosition-v1: CartPole-v1 (500 steps, reward 1 a step) observing the cart's position and the pole's angle
  only, the velocities hidden: the host twin of `env=cartpole env.observe=position` (rl-zoo's CartPoleNoVel-v1 and
  POPGym's PositionOnlyCartPole hide the same two; POPGym's caps episodes at 200 steps and scales returns to 1).
"""
import gymnasium
import numpy as np

POSITIONS = [0, 2]  # x and theta in CartPole's (x, x_dot, theta, theta_dot)


class CartPolePositions(gymnasium.ObservationWrapper):
    def __init__(self, env: gymnasium.Env):
        super().__init__(env)
        space = env.observation_space
        self.observation_space = gymnasium.spaces.Box(space.low[POSITIONS], space.high[POSITIONS], dtype=np.float32)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        return np.asarray(observation, np.float32)[POSITIONS]


def make_cartpole_position(**kwargs) -> gymnasium.Env:
    return CartPolePositions(gymnasium.make("CartPole-v1", **kwargs).unwrapped)


if "CartPolePosition-v1" not in gymnasium.registry:
    gymnasium.register("CartPolePosition-v1", entry_point=make_cartpole_position, max_episode_steps=500,
                       reward_threshold=475.0)
