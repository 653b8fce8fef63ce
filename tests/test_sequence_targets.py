"""R2D2's targets against hand-computed ones: the value rescaling, n-step double-Q returns along a sequence that
crosses episode ends, and the eta-mixed sequence priority."""
import jax.numpy as jnp
import numpy as np
import pytest

from lightspeed.algorithms.common.sequence_targets import (
    SequenceSteps,
    n_step_targets,
    rescale,
    sequence_priority,
    unrescale,
)


def test_rescale_and_its_inverse_undo_each_other():
    x = jnp.asarray([-1e4, -300.0, -1.0, -1e-3, 0.0, 2e-3, 0.5, 7.0, 500.0, 3e4])
    np.testing.assert_allclose(unrescale(rescale(x)), x, rtol=2e-5, atol=1e-5)
    np.testing.assert_allclose(rescale(unrescale(x)), x, rtol=2e-5, atol=1e-5)
    # h(x) by hand at x = 8: sqrt(9) - 1 + 1e-3 * 8
    assert float(rescale(jnp.float32(8.0))) == pytest.approx(2.008, abs=1e-6)
    assert float(rescale(jnp.float32(-8.0))) == pytest.approx(-2.008, abs=1e-6)


def steps(reward, terminated=None, truncated=None, start=None, acted=None, action=None) -> SequenceSteps:
    n = len(reward)
    flags = lambda x: jnp.zeros(n, bool) if x is None else jnp.asarray(x, bool)
    return SequenceSteps(jnp.zeros(n, jnp.int32) if action is None else jnp.asarray(action, jnp.int32),
                         jnp.asarray(reward, jnp.float32), flags(terminated), flags(truncated), flags(start),
                         jnp.ones(n, bool) if acted is None else jnp.asarray(acted, bool))


def test_n_step_targets_by_hand_with_double_q_and_the_sequence_end():
    # 6 steps, 2 actions; the online net picks action 1 where its Q is higher, the target net's value is read there
    q_online = jnp.asarray([[0, 1], [1, 0], [0, 1], [1, 0], [0, 1], [1, 0]], jnp.float32)
    q_target = jnp.asarray([[10, 20], [30, 40], [50, 60], [70, 80], [90, 100], [110, 120]], jnp.float32)
    values = [20, 30, 60, 70, 100, 110]  # Q_target(s_i, argmax Q_online(s_i))
    r = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    g = 0.9
    out = n_step_targets(q_online, q_target, steps(r), n_step=2, discount=g, rescaled=False)
    expected = [r[0] + g * r[1] + g**2 * values[2], r[1] + g * r[2] + g**2 * values[3],
                r[2] + g * r[3] + g**2 * values[4], r[3] + g * r[4] + g**2 * values[5],
                r[4] + g * values[5]]  # the window stops at the sequence's last observation
    np.testing.assert_allclose(out.target[:5], expected, rtol=1e-6)
    np.testing.assert_array_equal(out.valid, [1, 1, 1, 1, 1, 0])  # the last step has no successor in the sequence


def test_n_step_targets_stop_at_episode_ends():
    q = jnp.zeros((7, 1)) + jnp.arange(7, dtype=jnp.float32)[:, None] * 10  # value of s_i: 10 i
    r = [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    g = 0.5
    # step 1 terminates (no bootstrap); step 2 begins a new episode; step 3 is truncated (its bootstrap, the final
    # observation, is not stored: no target for the steps whose window reaches it); step 4 begins an episode
    out = n_step_targets(q, q, steps(r, terminated=[0, 1, 0, 0, 0, 0, 0], truncated=[0, 0, 0, 1, 0, 0, 0],
                                     start=[0, 0, 1, 0, 1, 0, 0]), n_step=3, discount=g, rescaled=False)
    np.testing.assert_allclose(out.target[0], 1 + g * 1, rtol=1e-6)  # ends at the termination
    np.testing.assert_allclose(out.target[1], 1, rtol=1e-6)
    np.testing.assert_array_equal(out.valid, [1, 1, 0, 0, 1, 1, 0])
    np.testing.assert_allclose(out.target[4], 1 + g * 1 + g**2 * 60, rtol=1e-6)
    np.testing.assert_allclose(out.target[5], 1 + g * 60, rtol=1e-6)


def test_a_reset_step_and_a_restarted_stream_have_no_target():
    q = jnp.ones((5, 1))
    # step 1 ended the episode; step 2 is a host engine's reset step (not acted); step 3 begins the next episode.
    # Step 4's observation begins a restarted stream without any end flag at step 3: step 3's window is cut.
    out = n_step_targets(q, q, steps([1, 1, 0, 1, 1], terminated=[0, 1, 0, 0, 0], start=[0, 0, 0, 1, 1],
                                     acted=[1, 1, 0, 1, 1]), n_step=2, discount=0.9, rescaled=False)
    np.testing.assert_array_equal(out.valid, [1, 1, 0, 0, 0])


def test_rescaled_targets_apply_h_to_the_return_and_h_inverse_to_the_bootstrap():
    q = jnp.asarray([[0.0], [2.0], [3.0]])
    out = n_step_targets(q, q, steps([1.0, 1.0, 1.0]), n_step=1, discount=0.9, rescaled=True)
    np.testing.assert_allclose(out.target[:2], rescale(1.0 + 0.9 * unrescale(q[1:, 0])), rtol=1e-6)


def test_targets_are_rescaled_unless_told_otherwise():
    q = jnp.asarray([[0.0], [2.0], [3.0]])
    rescaled = n_step_targets(q, q, steps([1.0, 1.0, 1.0]), n_step=1, discount=0.9, rescaled=True)
    np.testing.assert_array_equal(n_step_targets(q, q, steps([1.0, 1.0, 1.0]), n_step=1, discount=0.9).target,
                                  rescaled.target)


def test_sequence_priority_mixes_max_and_mean_over_valid_steps():
    errors = jnp.asarray([[1.0, -3.0, 2.0, 100.0], [0.0, 0.0, 0.0, 0.0]])
    valid = jnp.asarray([[1.0, 1.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    priority = sequence_priority(errors, valid, eta=0.9)
    np.testing.assert_allclose(priority, [0.9 * 3.0 + 0.1 * 2.0, 0.0], rtol=1e-6)


def reference_priority(errors, valid, eta: float) -> float:
    """One sequence's priority in plain Python: eta max + (1 - eta) mean of |error| over its valid steps."""
    magnitudes = [abs(float(e)) for e, v in zip(errors, valid, strict=True) if v]
    return eta * max(magnitudes) + (1 - eta) * sum(magnitudes) / len(magnitudes) if magnitudes else 0.0


def test_sequence_priority_is_each_sequences_own_over_any_leading_axes():
    # [2, 3, T=4] with 3, 1, 0, 4, 2 and 2 valid steps: the masked errors (100, 9, -8) must not count
    errors = np.asarray([[[1.0, -3.0, 2.0, 100.0], [4.0, -1.0, 0.5, 2.0], [-7.0, 5.0, 1.0, 3.0]],
                         [[2.0, 2.0, -6.0, 1.0], [0.0, 9.0, 0.0, 0.0], [3.0, 1.0, 1.5, -8.0]]], np.float32)
    valid = np.asarray([[[1, 1, 1, 0], [0, 1, 0, 0], [0, 0, 0, 0]],
                        [[1, 1, 1, 1], [1, 0, 1, 0], [0, 1, 1, 0]]], np.float32)
    expected = np.reshape([reference_priority(e, v, 0.9)
                           for e, v in zip(errors.reshape(-1, 4), valid.reshape(-1, 4), strict=True)], (2, 3))
    priority = sequence_priority(jnp.asarray(errors), jnp.asarray(valid), eta=0.9)
    np.testing.assert_allclose(priority, expected, rtol=1e-6)
    # a single sequence [T]: its one valid step is both the max and the mean
    np.testing.assert_allclose(sequence_priority(jnp.asarray(errors[0, 1]), jnp.asarray(valid[0, 1]), eta=0.9), 1.0,
                               rtol=1e-6)
