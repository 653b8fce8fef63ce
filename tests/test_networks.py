"""The matmul convolutions (algorithms/common/networks.py) against flax's nn.Conv: same parameters, same
outputs and gradients, and the Nature torso picked for Atari-sized frames."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lightspeed.algorithms.common.networks import Conv3x3, QNetwork, StridedConv


@pytest.mark.parametrize("size, stride, shape", [(8, 4, (84, 84, 4)), (4, 2, (20, 20, 32)), (3, 1, (9, 9, 64)),
                                                 (4, 2, (11, 13, 3)), (6, 3, (14, 14, 2))])
def test_strided_conv_is_nn_conv(size, stride, shape):
    images = jax.random.uniform(jax.random.key(0), (2, *shape))
    reference = nn.Conv(7, (size, size), (stride, stride), padding="VALID")
    ours = StridedConv(7, size, stride)
    params = reference.init(jax.random.key(1), images)
    # the same initialisation, parameter for parameter
    assert jax.tree.all(jax.tree.map(jnp.array_equal, ours.init(jax.random.key(1), images), params))
    np.testing.assert_allclose(ours.apply(params, images), reference.apply(params, images), rtol=1e-5, atol=1e-5)
    loss = lambda module: lambda params, images: jnp.sum(jnp.sin(module.apply(params, images)))
    ours_grads = jax.grad(loss(ours), argnums=(0, 1))(params, images)
    reference_grads = jax.grad(loss(reference), argnums=(0, 1))(params, images)
    for got, want in zip(jax.tree.leaves(ours_grads), jax.tree.leaves(reference_grads), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_conv3x3_is_nn_conv():
    images = jax.random.uniform(jax.random.key(2), (3, 10, 10, 4))
    params = nn.Conv(16, (3, 3), padding="VALID").init(jax.random.key(3), images)
    np.testing.assert_allclose(Conv3x3(16).apply(params, images),
                               nn.Conv(16, (3, 3), padding="VALID").apply(params, images), rtol=1e-5, atol=1e-5)


def test_the_nature_torso_reads_bytes_as_fractions():
    network = QNetwork(num_actions=6, torso="nature", dueling=True, observation_ndim=3)
    frames = jax.random.randint(jax.random.key(4), (2, 84, 84, 4), 0, 256).astype(jnp.uint8)
    params = network.init(jax.random.key(5), frames)
    kernels = [params["params"][f"StridedConv_{i}"]["kernel"].shape for i in range(3)]
    assert kernels == [(8, 8, 4, 32), (4, 4, 32, 64), (3, 3, 64, 64)]
    assert params["params"]["Dense_0"]["kernel"].shape == (7 * 7 * 64, 512)
    np.testing.assert_allclose(network.apply(params, frames), network.apply(params, frames.astype(jnp.float32) / 255),
                               rtol=1e-6)
