"""Flax Q-networks and the parameter plumbing shared by DQN and Ape-X."""
from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from lightspeed.framework.core.errors import check, check_choice

MAX_WIDTH = 8192  # a layer of 1e8 units passed the state-size check, then ran out of memory in its activations
ACTIVATIONS = {"relu": nn.relu, "tanh": nn.tanh, "gelu": nn.gelu, "silu": nn.silu, "elu": nn.elu}


TORSOS = ("mlp", "conv", "nature")
NATURE_LAYERS = ((32, 8, 4), (64, 4, 2), (64, 3, 1))  # (filters, kernel, stride) of Mnih et al. 2015's torso
NATURE_MIN_SIZE = 36  # the smallest image its three VALID convolutions take


def neighbourhood_matmul(images: jax.Array, kernel: jax.Array, bias: jax.Array) -> jax.Array:
    """A k x k, stride-1, VALID convolution as one matmul over the k x k neighbourhoods (im2col); `kernel`
    [k, k, C, F] as nn.Conv lays it out."""
    size, _, channels, features = kernel.shape
    height, width = images.shape[-3] - size + 1, images.shape[-2] - size + 1
    windows = [images[..., i:i + height, j:j + width, :] for i in range(size) for j in range(size)]
    return jnp.concatenate(windows, axis=-1) @ kernel.reshape(size * size * channels, features) + bias


class Conv3x3(nn.Module):
    """A 3x3, stride-1, VALID convolution as one matmul over the 3x3 neighbourhoods (im2col).

    The same maths and kernel layout [3, 3, C, F] as `nn.Conv(F, (3, 3), padding="VALID")`; on this
    CPU a training step of MinAtar's net on a batch of 128 takes 3.0 ms this way, 12.7 ms with XLA's
    convolution.
    """

    features: int

    @nn.compact
    def __call__(self, images: jax.Array) -> jax.Array:
        channels = images.shape[-1]
        kernel = self.param("kernel", nn.initializers.lecun_normal(), (3, 3, channels, self.features))
        bias = self.param("bias", nn.initializers.zeros, (self.features,))
        return neighbourhood_matmul(images, kernel, bias)


def space_to_depth(images: jax.Array, block: int) -> jax.Array:
    """[..., H, W, C] -> [..., H / block, W / block, block * block * C]: each block's pixels as channels."""
    *batch, height, width, channels = images.shape
    blocks = images.reshape(*batch, height // block, block, width // block, block, channels)
    return jnp.swapaxes(blocks, -4, -3).reshape(*batch, height // block, width // block, block * block * channels)


class StridedConv(nn.Module):
    """A k x k, stride-s, VALID convolution (k a multiple of s) as matmuls: the image's s x s blocks folded
    into channels make it a stride-1 (k/s) x (k/s) convolution, done as one matmul over neighbourhoods.

    The same maths, kernel layout [k, k, C, F] and initialisation as `nn.Conv(F, (k, k), (s, s),
    padding="VALID")` (tests/test_networks.py); inside the learner's `lax.scan` XLA's CPU convolution is
    the slow part: an update of the Nature DQN network on a batch of 32 took 645 ms with nn.Conv in a scan
    on this 2-core CPU, 69 ms this way (bench/bench_atari.py measures it).
    """

    features: int
    size: int
    stride: int

    @nn.compact
    def __call__(self, images: jax.Array) -> jax.Array:
        size, stride, channels = self.size, self.stride, images.shape[-1]
        kernel = self.param("kernel", nn.initializers.lecun_normal(), (size, size, channels, self.features))
        bias = self.param("bias", nn.initializers.zeros, (self.features,))
        if stride == 1:
            return neighbourhood_matmul(images, kernel, bias)
        rows, columns = (images.shape[-3] - size) // stride + 1, (images.shape[-2] - size) // stride + 1
        # the pixels the convolution reads, then s x s blocks as channels: [.., rows - 1 + k/s, .., s * s * C]
        used = images[..., : (rows - 1) * stride + size, : (columns - 1) * stride + size, :]
        blocks, folded = space_to_depth(used, stride), size // stride
        # the kernel's taps regrouped the same way: [k/s, s, k/s, s, C, F] -> [k/s, k/s, s * s * C, F]
        block_kernel = kernel.reshape(folded, stride, folded, stride, channels, self.features).transpose(
            0, 2, 1, 3, 4, 5).reshape(folded, folded, stride * stride * channels, self.features)
        return neighbourhood_matmul(blocks, block_kernel, bias)


class QNetwork(nn.Module):
    """A torso and a Q head: plain, or dueling (value + advantage minus its mean).

    Torsos: "mlp", Dense layers of `hidden_sizes` over the flattened observation; "conv", for
    [H, W, C] images, 3x3 stride-1 convolutions of `conv_channels` filters and one Dense layer of
    `conv_dense` units (MinAtar's network: one conv of 16 filters and 128 units, Young & Tian 2019);
    "nature", for Atari's 84x84 frames, Mnih et al. 2015's three convolutions (8x8/4, 4x4/2, 3x3/1, as
    StridedConv's matmuls) and 512 units. uint8 observations are scaled to [0, 1] here, so replay keeps them as bytes.
    `layer_norm`: LayerNorm between each hidden Dense and its activation (PQN, Gallici et al. 2024),
    which keeps the features' scale fixed while the targets move.
    """

    num_actions: int
    hidden_sizes: Sequence[int] = (64, 64)
    activation: str = "relu"
    dueling: bool = False
    layer_norm: bool = False
    torso: str = "mlp"
    conv_channels: Sequence[int] = (16,)
    conv_dense: int = 128
    observation_ndim: int = 1  # the observation's own rank: the axes before it are batch axes

    @nn.compact
    def __call__(self, obs: jax.Array) -> jax.Array:
        return q_head(self, torso_features(self, obs))


def torso_features(net: Any, obs: jax.Array) -> jax.Array:
    """The torso of `net` (a Q-network's fields) over `obs` [..., *observation]: called inside the network's compact
    method, so its layers are the network's own (QNetwork's parameter names stay Dense_0, Dense_1, ...)."""
    activation = ACTIVATIONS[net.activation]
    batch_shape = obs.shape[: obs.ndim - net.observation_ndim]
    features = obs.astype(jnp.float32)  # observations keep their own dtype (MinAtar's booleans) until here
    if obs.dtype == jnp.uint8:
        features = features / 255.0
    dense_sizes = net.hidden_sizes
    if net.torso == "nature":
        features = features.reshape(-1, *obs.shape[obs.ndim - net.observation_ndim:])
        for filters, size, stride in NATURE_LAYERS:
            features = activation(StridedConv(filters, size, stride)(features))
        dense_sizes = (512,)
    elif net.torso == "conv":
        features = features.reshape(-1, *obs.shape[obs.ndim - net.observation_ndim:])
        for channels in net.conv_channels:
            features = activation(Conv3x3(channels)(features))
        dense_sizes = (net.conv_dense,)
    features = features.reshape(*batch_shape, -1)
    for size in dense_sizes:
        features = nn.Dense(size)(features)
        features = activation(nn.LayerNorm()(features) if net.layer_norm else features)
    return features


def q_head(net: Any, features: jax.Array) -> jax.Array:
    """Q-values from features: one Dense layer, or dueling (value + advantage minus its mean)."""
    if not net.dueling:
        return nn.Dense(net.num_actions)(features)
    value = nn.Dense(1)(features)
    advantages = nn.Dense(net.num_actions)(features)
    return value + advantages - advantages.mean(axis=-1, keepdims=True)


def check_network_config(config: Any) -> None:
    """The network keys of any Q-network algorithm: hidden_sizes, activation, torso, conv_channels, conv_dense."""
    sizes = lambda values: len(values) > 0 and all(isinstance(s, int) and 1 <= s <= MAX_WIDTH for s in values)
    check(sizes(config.hidden_sizes), "algo.hidden_sizes", list(config.hidden_sizes),
          f"a non-empty list of integers from 1 to {MAX_WIDTH}")
    check_choice("algo.activation", config.activation, tuple(ACTIVATIONS))
    check(config.torso is None or config.torso in TORSOS, "algo.torso", config.torso,
          f"null (nature for [H, W, C] images of at least {NATURE_MIN_SIZE}x{NATURE_MIN_SIZE}, conv for smaller "
          "ones, else mlp), mlp, conv or nature")
    check(sizes(config.conv_channels), "algo.conv_channels", list(config.conv_channels),
          f"a non-empty list of integers from 1 to {MAX_WIDTH}")
    check(isinstance(config.conv_dense, int) and 1 <= config.conv_dense <= MAX_WIDTH, "algo.conv_dense",
          config.conv_dense, f"an integer from 1 to {MAX_WIDTH}")


def make_q_network(config: Any, env: Any) -> QNetwork:
    """The Q-network an algorithm config describes, for the env's observations and actions."""
    shape = tuple(env.observation_shape)
    image = len(shape) == 3
    torso = config.torso or ("mlp" if not image else "nature" if min(shape[:2]) >= NATURE_MIN_SIZE else "conv")
    smallest = NATURE_MIN_SIZE if torso == "nature" else 3
    check(torso == "mlp" or image and min(shape[:2]) >= smallest, "algo.torso", torso,
          "mlp (or null) for these observations", f"a {torso} torso needs [H, W, C] images of at least "
          f"{smallest}x{smallest}, env {env.name} gives {list(shape)}")
    return QNetwork(env.num_actions, tuple(config.hidden_sizes), config.activation, config.dueling, config.layer_norm,
                    torso, tuple(config.conv_channels), config.conv_dense, max(len(shape), 1))


def select_tree(condition: jax.Array, new: Any, old: Any) -> Any:
    """`new` where `condition` holds, else `old`, leaf by leaf (a branch-free cond under vmap)."""
    return jax.tree.map(lambda a, b: jnp.where(condition, a, b), new, old)
