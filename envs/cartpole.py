"""CartPole: gymnasium's CartPole-v1 physics (Euler integration) as a functional JAX environment.

Reward is 1.0 every step; the episode terminates when |x| > 2.4 or |theta| > 12 degrees and is
truncated when `time` reaches `max_steps`, independently of termination (as gymnasium's
TimeLimit does). The transition is deterministic, so `step` hands its whole key to the reset.
"""
import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from lightspeed.framework.core.env import Environment, StepResult
from lightspeed.framework.core.errors import check_choice, check_positive_int
from lightspeed.framework.core.registry import register_env


@dataclasses.dataclass
class CartPoleConfig:
    name: str = "cartpole"  # the registered name of the env that env=cartpole chooses
    # Episodes are truncated (not terminated) after this many steps.
    max_steps: int = 500
    # full: (x, x_dot, theta, theta_dot); position: (x, theta) only, the velocities hidden (a memory task: a policy
    # must infer them from the positions it saw, as POPGym's PositionOnlyCartPole)
    observe: str = "full"

    def validate(self) -> None:
        """Raise a ConfigError naming the first bad key; pure Python, no JAX."""
        check_positive_int("env.max_steps", self.max_steps)
        check_choice("env.observe", self.observe, OBSERVATIONS)


@struct.dataclass
class CartPoleState:
    x: jax.Array
    x_dot: jax.Array
    theta: jax.Array
    theta_dot: jax.Array
    time: jax.Array


@struct.dataclass
class CartPoleParams:
    gravity: float = 9.8
    masscart: float = 1.0
    masspole: float = 0.1
    length: float = 0.5  # half the pole's length
    force_mag: float = 10.0
    tau: float = 0.02  # seconds between state updates
    x_threshold: float = 2.4
    theta_threshold_radians: float = 12 * 2 * math.pi / 360
    max_steps: int = 500


OBSERVATIONS = ("full", "position")


def observation(state: CartPoleState) -> jax.Array:
    return jnp.stack([state.x, state.x_dot, state.theta, state.theta_dot])


def position_observation(state: CartPoleState) -> jax.Array:
    return jnp.stack([state.x, state.theta])


def reset_noise(key: jax.Array) -> jax.Array:
    """Four values uniform in [-0.05, 0.05) (16-bit resolution)."""
    # 2 words hash 2 threefry blocks (partitionable threefry), uniform((4,)) 4: ~1.3x more steps/s.
    words = jax.random.bits(key, (2,), jnp.uint32)
    halves = jnp.concatenate([words & 0xFFFF, words >> 16])
    return halves.astype(jnp.float32) * (0.1 / 65536) - 0.05


def physics_step(state: CartPoleState, action: jax.Array, params: CartPoleParams) -> CartPoleState:
    """One Euler step, in gymnasium's formula order so float32 results track it closely."""
    total_mass = params.masspole + params.masscart
    polemass_length = params.masspole * params.length
    force = jnp.where(action == 1, params.force_mag, -params.force_mag)
    costheta, sintheta = jnp.cos(state.theta), jnp.sin(state.theta)
    temp = (force + polemass_length * jnp.square(state.theta_dot) * sintheta) / total_mass
    thetaacc = (params.gravity * sintheta - costheta * temp) / (
        params.length * (4.0 / 3.0 - params.masspole * jnp.square(costheta) / total_mass)
    )
    xacc = temp - polemass_length * thetaacc * costheta / total_mass
    return CartPoleState(
        x=state.x + params.tau * state.x_dot,
        x_dot=state.x_dot + params.tau * xacc,
        theta=state.theta + params.tau * state.theta_dot,
        theta_dot=state.theta_dot + params.tau * thetaacc,
        time=state.time + 1,
    )


def is_terminal(state: CartPoleState, params: CartPoleParams) -> jax.Array:
    return (jnp.abs(state.x) > params.x_threshold) | (jnp.abs(state.theta) > params.theta_threshold_radians)


FRAME_SIZE = (480, 320)  # width, height in pixels
PIXELS_PER_METRE = FRAME_SIZE[0] / 4.8  # the track from -2.4 to 2.4 fills the frame, as gymnasium draws it
CART_SIZE = (0.4, 0.24)  # metres
POLE_WIDTH = 0.08


def draw_cartpole(x: float, theta: float, time: int, params: CartPoleParams) -> np.ndarray:
    """A side view: the track, the cart at `x` and the pole leaning `theta` from upright."""
    from PIL import Image, ImageDraw  # Pillow (matplotlib's dependency), only when drawing

    width, height = FRAME_SIZE
    image = Image.new("RGB", FRAME_SIZE, "white")
    draw = ImageDraw.Draw(image)
    track_y = int(height * 0.7)
    to_pixels = lambda px, py: (width / 2 + px * PIXELS_PER_METRE, track_y - py * PIXELS_PER_METRE)
    draw.line([(0, track_y), (width, track_y)], fill="black", width=1)
    cart_w, cart_h = CART_SIZE
    draw.rectangle([to_pixels(x - cart_w / 2, cart_h / 2), to_pixels(x + cart_w / 2, -cart_h / 2)], fill="black")
    # the pole's four corners, rotated about the axle at the top of the cart
    along = np.array([math.sin(theta), math.cos(theta)]) * 2 * params.length
    across = np.array([math.cos(theta), -math.sin(theta)]) * POLE_WIDTH / 2
    axle = np.array([x, cart_h / 4])
    corners = [axle - across, axle + across, axle + across + along, axle - across + along]
    draw.polygon([to_pixels(*corner) for corner in corners], fill=(202, 152, 101))
    axle_x, axle_y = to_pixels(*axle)
    radius = POLE_WIDTH / 2 * PIXELS_PER_METRE
    draw.ellipse([axle_x - radius, axle_y - radius, axle_x + radius, axle_y + radius], fill=(129, 132, 203))
    draw.text((8, 8), f"step {time}", fill="black")
    return np.asarray(image)


class CartPole(Environment):
    name = "cartpole"
    # step_env uses no randomness: the base class's step gives the whole key to reset_env.
    stochastic_transitions = False
    render_fps = 50  # tau = 0.02 s a step

    def __init__(self, observe: str = "full"):
        self.observe = observe
        self.observation = position_observation if observe == "position" else observation

    @property
    def default_params(self) -> CartPoleParams:
        return CartPoleParams()

    @property
    def num_actions(self) -> int:
        return 2

    @property
    def observation_shape(self) -> tuple[int, ...]:
        return (2,) if self.observe == "position" else (4,)

    def max_episode_steps(self, params: CartPoleParams) -> int:
        return int(params.max_steps)

    def render(self, state: CartPoleState, params: CartPoleParams) -> np.ndarray:
        return draw_cartpole(float(state.x), float(state.theta), int(state.time), params)

    def reset_env(self, key: jax.Array, params: CartPoleParams) -> tuple[jax.Array, CartPoleState]:
        x, x_dot, theta, theta_dot = reset_noise(key)
        state = CartPoleState(x=x, x_dot=x_dot, theta=theta, theta_dot=theta_dot, time=jnp.int32(0))
        return self.observation(state), state

    def step_env(self, key: jax.Array, state: CartPoleState, action: jax.Array, params: CartPoleParams) -> StepResult:
        next_state = physics_step(state, action, params)
        terminated = is_terminal(next_state, params)
        truncated = next_state.time >= params.max_steps
        reward = jnp.float32(1.0)
        return self.observation(next_state), next_state, reward, terminated, truncated, {}


@register_env("cartpole", config=CartPoleConfig)
def make_cartpole(config: CartPoleConfig) -> tuple[CartPole, CartPoleParams]:
    return CartPole(config.observe), CartPoleParams(max_steps=config.max_steps)
