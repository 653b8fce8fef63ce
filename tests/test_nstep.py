"""The actor's n-step window: what it holds after each push, and the replay item it hands out, against
transitions worked out in numpy from the same steps."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lightspeed.algorithms.common.nstep import empty_window, oldest_transition, push

N, NUM_ENVS, OBS_DIM, GAMMA, STEPS = 3, 2, 4, 0.9, 9


def reference_transition(steps, start, n, gamma):
    """The n-step item that starts at `start`, one env, from a plain loop over its recorded steps."""
    n_step_return, discount = 0.0, 1.0
    for k in range(n):
        step = steps[start + k]
        n_step_return += discount * step["reward"]
        discount *= gamma
        if step["terminated"] or step["truncated"] or k == n - 1:
            return n_step_return, step["next_obs"], 0.0 if step["terminated"] else discount


def random_steps(rng, count):
    """Per env: observations, actions, rewards and episode ends; each env ends episodes at its own steps."""
    terminated, truncated = rng.random((count, NUM_ENVS)) < 0.2, rng.random((count, NUM_ENVS)) < 0.2
    return [{"obs": rng.normal(size=(NUM_ENVS, OBS_DIM)).astype(np.float32),
             "action": rng.integers(0, 5, NUM_ENVS).astype(np.int32),
             "reward": rng.normal(size=NUM_ENVS).astype(np.float32),
             "terminated": terminated[t], "truncated": truncated[t],
             "next_obs": rng.normal(size=(NUM_ENVS, OBS_DIM)).astype(np.float32)} for t in range(count)]


@pytest.fixture(scope="module")
def pushed():
    """The window after every one of STEPS pushes (one compiled push, reused)."""
    rng = np.random.default_rng(0)
    steps = random_steps(rng, STEPS)
    # both kinds of episode end occur, in either env, somewhere in the sequence
    assert any(s["terminated"].any() for s in steps) and any(s["truncated"].any() for s in steps)
    step_fn = jax.jit(lambda window, step: push(window, step, N))
    window = empty_window(jnp.asarray(steps[0]["obs"]), N)
    history = []
    for step in steps:
        window = step_fn(window, {k: jnp.asarray(v) for k, v in step.items()})
        history.append(window)
    return steps, history


def test_an_empty_window_holds_zeros_of_the_right_shapes_and_types():
    obs = jnp.ones((NUM_ENVS, OBS_DIM), jnp.float32)
    window = empty_window(obs, N)
    assert window.obs.shape == window.next_obs.shape == (N, NUM_ENVS, OBS_DIM)
    assert window.obs.dtype == window.next_obs.dtype == jnp.float32
    for field, dtype in (("action", jnp.int32), ("reward", jnp.float32), ("terminated", bool), ("truncated", bool)):
        assert getattr(window, field).shape == (N, NUM_ENVS) and getattr(window, field).dtype == dtype, field
    for field in ("obs", "action", "reward", "terminated", "truncated", "next_obs"):
        assert not np.asarray(getattr(window, field)).any(), field
    assert int(window.filled) == 0
    boolean_obs = empty_window(jnp.ones((NUM_ENVS, 5, 5), bool), 2)  # MinAtar-like observations keep their type
    assert boolean_obs.obs.shape == (2, NUM_ENVS, 5, 5) and boolean_obs.obs.dtype == bool


def test_the_window_holds_the_last_n_steps_oldest_first(pushed):
    steps, history = pushed
    for t, window in enumerate(history):
        window = jax.tree.map(np.asarray, window)
        assert int(window.filled) == min(t + 1, N)
        for age in range(min(t + 1, N)):  # position N - 1 is the newest step
            expected = steps[t - age]
            for field in expected:
                np.testing.assert_array_equal(getattr(window, field)[N - 1 - age], expected[field], err_msg=field)


def test_the_oldest_item_is_the_n_step_transition_from_the_window_start(pushed):
    steps, history = pushed
    # called here, not in the shared fixture, so that mutmut sees which test exercises oldest_transition
    item_fn = jax.jit(lambda window: oldest_transition(window, GAMMA))
    for t, window in enumerate(history):
        item = jax.tree.map(np.asarray, item_fn(window))
        if t < N - 1:  # not a full window yet: the item is marked invalid
            np.testing.assert_array_equal(item.valid, np.zeros(NUM_ENVS, np.float32))
            continue
        start = t - N + 1
        np.testing.assert_array_equal(item.valid, np.ones(NUM_ENVS, np.float32))
        np.testing.assert_array_equal(item.obs, steps[start]["obs"])
        np.testing.assert_array_equal(item.action, steps[start]["action"])
        for env in range(NUM_ENVS):
            per_env = [{k: v[env] for k, v in s.items()} for s in steps]
            n_step_return, bootstrap_obs, discount = reference_transition(per_env, start, N, GAMMA)
            assert item.n_step_return[env] == pytest.approx(n_step_return, rel=1e-5, abs=1e-6)
            np.testing.assert_array_equal(item.bootstrap_obs[env], bootstrap_obs)
            assert item.bootstrap_discount[env] == pytest.approx(discount, rel=1e-6)
    assert item.valid.dtype == np.float32


def test_a_one_step_window_is_valid_at_once():
    obs = jnp.zeros((NUM_ENVS, OBS_DIM))
    step = {"obs": obs, "action": jnp.array([1, 2], jnp.int32), "reward": jnp.array([1.5, -2.0]),
            "terminated": jnp.array([True, False]), "truncated": jnp.array([False, False]), "next_obs": obs + 7.0}
    window = push(empty_window(obs, 1), step, 1)
    item = oldest_transition(window, GAMMA)
    assert int(window.filled) == 1
    np.testing.assert_array_equal(item.valid, [1.0, 1.0])
    np.testing.assert_allclose(item.n_step_return, [1.5, -2.0])
    np.testing.assert_allclose(item.bootstrap_discount, [0.0, GAMMA])
    np.testing.assert_array_equal(item.action, [1, 2])


def test_a_host_window_records_acted_and_a_box_window_holds_float_action_vectors():
    obs = jnp.ones((NUM_ENVS, OBS_DIM), jnp.float32)
    assert empty_window(obs, N).acted is None  # the single program: every step acted
    acted = empty_window(obs, N, host=True).acted
    assert acted.shape == (N, NUM_ENVS) and acted.dtype == bool and not np.asarray(acted).any()
    box = empty_window(obs, N, action=jax.ShapeDtypeStruct((3,), jnp.float32))
    assert box.action.shape == (N, NUM_ENVS, 3) and box.action.dtype == jnp.float32


def test_on_a_host_no_item_starts_at_a_step_the_engine_spent_on_a_reset():
    """Env 0's oldest step was a reset (acted False), env 1's acted; the newer steps acted the other way round."""
    obs = jnp.zeros((NUM_ENVS, OBS_DIM))
    window = empty_window(obs, 2, host=True)
    for acted in ([False, True], [True, False]):
        step = {"obs": obs, "action": jnp.array([1, 2], jnp.int32), "reward": jnp.array([1.0, 1.0]),
                "terminated": jnp.array([False, False]), "truncated": jnp.array([False, False]), "next_obs": obs,
                "acted": jnp.array(acted)}
        window = push(window, step, 2)
    item = oldest_transition(window, GAMMA)
    assert item.valid.dtype == jnp.float32
    np.testing.assert_array_equal(item.valid, [0.0, 1.0])
