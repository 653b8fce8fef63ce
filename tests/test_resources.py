"""Memory and disk are checked against the training state's size before anything compiles."""
import jax
import jax.numpy as jnp
import pytest

from lightspeed.framework.core.algorithm import Memory
from lightspeed.framework.core.errors import ConfigError
from lightspeed.framework.run.resources import GIB, check_fits, state_bytes

STATE = {"replay_state": {"obs": jax.ShapeDtypeStruct((1000, 4), jnp.float32)}, "params": jnp.zeros(10)}


def test_state_bytes_by_hand():
    total, where, largest = state_bytes(STATE)
    assert (total, largest) == (16000 + 40, 16000) and "replay_state" in where


def test_a_state_larger_than_free_memory_names_the_buffer(tmp_path):
    replay = Memory("replay_state", "algo.buffer_size", 1000)
    with pytest.raises(ConfigError, match=r"algo\.buffer_size.*free memory"):
        check_fits(STATE, tmp_path, 0, on_cpu=True, memory=replay, free_memory=10_000)
    with pytest.raises(ConfigError, match=r"num_seeds.*free memory"):  # an algorithm that declares no memory
        check_fits(STATE, tmp_path, 0, on_cpu=True, free_memory=10_000)
    check_fits(STATE, tmp_path, 0, on_cpu=False, free_memory=10_000)  # accelerator memory is not host memory


def test_checkpoints_need_keep_plus_one_copies_on_disk(tmp_path):
    check_fits(STATE, tmp_path, 3, on_cpu=True, free_memory=GIB, free_disk=4 * 16040)
    with pytest.raises(ConfigError, match=r"hydra\.run\.dir.*4 checkpoints"):
        check_fits(STATE, tmp_path, 3, on_cpu=True, free_memory=GIB, free_disk=4 * 16040 - 1)
    check_fits(STATE, tmp_path, 0, on_cpu=True, free_memory=GIB, free_disk=0)  # no checkpoints, no disk needed
