"""Spaces in the env contract (framework/core/spaces.py): what the built-in envs declare, gymnasium's spaces carried
over, and the registry's refusals of an env that declares none or a space of another kind."""
import gymnasium
import jax.numpy as jnp
import numpy as np
import pytest

from lightspeed import envs
from lightspeed.framework.core import registry
from lightspeed.framework.core.env import Environment
from lightspeed.framework.core.errors import PluginError
from lightspeed.framework.core.host_env import env_action, env_actions
from lightspeed.framework.core.spaces import BOX, DISCRETE, Box, Discrete, from_gymnasium


def test_built_in_envs_declare_their_spaces():
    env, params = envs.make("cartpole")
    assert env.action_space(params) == Discrete(2) and env.num_actions == 2
    assert env.observation_space(params).shape == (4,) and env.observation_space(params).kind == BOX
    grid, grid_params = envs.make("gridworld")
    assert grid.action_space(grid_params) == Discrete(4)


def test_box_bounds_broadcast_and_compare_by_value():
    box = Box(-2.0, 2.0, (3,))
    assert box.low.shape == (3,) and box.dtype == np.float32 and box.kind == BOX
    assert box == Box(np.full(3, -2.0), np.full(3, 2.0), (3,), np.float32)
    assert box != Box(-1.0, 2.0, (3,)) and box != Box(-2.0, 2.0, (3,), np.float64)
    assert box.describe() == "Box(shape=(3,), float32, [-2, 2])"
    with pytest.raises(ValueError, match="low is above high"):
        Box(1.0, 0.0, (2,))
    with pytest.raises(ValueError, match="positive int"):
        Discrete(0)


def test_gymnasium_spaces_carry_over_and_others_are_refused():
    assert from_gymnasium(gymnasium.spaces.Discrete(3, start=1)) == Discrete(3, 1)
    pendulum = from_gymnasium(gymnasium.make("Pendulum-v1").action_space)
    assert pendulum == Box(-2.0, 2.0, (1,), np.float32) and pendulum.kind == BOX
    with pytest.raises(ValueError, match="a Dict space"):
        from_gymnasium(gymnasium.spaces.Dict({"x": gymnasium.spaces.Discrete(2)}))


def test_policy_actions_reach_an_env_as_its_space_takes_them():
    shifted = Discrete(3, start=-1)
    assert env_action(shifted)(np.int32(0)) == -1 and env_actions(shifted, np.array([0, 2])).tolist() == [-1, 1]
    box = Box(np.array([-1.0, 0.0]), np.array([1.0, 2.0]), (2,))
    assert env_action(box)(np.array([5.0, -3.0])).tolist() == [1.0, 0.0]
    batch = env_actions(box, np.array([[0.5, 0.5], [-9.0, 9.0]], np.float64))
    assert batch.dtype == np.float32 and batch.tolist() == [[0.5, 0.5], [-1.0, 2.0]]


class Shapeless(Environment):
    """Declares neither num_actions nor action_space."""
    name = "shapeless"
    observation_shape = (1,)
    default_params = None

    def reset_env(self, key, params):
        return jnp.zeros(1), jnp.int32(0)


class TwoDimensionalActions(Shapeless):
    name = "two_dimensional"

    def action_space(self, params):
        return Box(-1.0, 1.0, (2,))


def test_an_env_without_an_action_space_is_named():
    with pytest.raises(PluginError, match="defines neither num_actions nor action_space"):
        registry.check_env("shapeless", Shapeless(), None)
    registry.check_env("two_dimensional", TwoDimensionalActions(), None)  # a Box of actions is a contract kept
    with pytest.raises(AttributeError, match="no number of actions"):
        _ = TwoDimensionalActions().num_actions


def test_an_algorithm_declares_known_action_kinds():
    with pytest.raises(PluginError, match="acts=\\('continuous',\\)"):
        registry.register_algorithm("bad", config=object, acts=("continuous",))
    assert registry.lookup("algo", "dqn").acts == (DISCRETE,)
