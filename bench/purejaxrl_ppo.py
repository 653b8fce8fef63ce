"""PureJaxRL's own PPO (purejaxrl/ppo.py of a checkout, its CartPole-v1 config) on this machine, the seeds vmapped
in one jit; run by bench/bench_ppo.py, one JSON line on stdout: the final greedy return of every seed over
`episodes` episodes, compile and run seconds, and the wall-clock from this process's launch.

    python bench/purejaxrl_ppo.py '{"purejaxrl": "DIR", "env_steps": 500000, "seed": 2027, "seeds": 10,
                                    "episodes": 100}'

Nothing of PureJaxRL is changed: gymnax 1.0's six-value step is adapted to the five values PureJaxRL reads (done =
terminated or truncated), and wrappers.py's imports of brax and navix (other envs') get empty modules. PureJaxRL
imports distrax besides this project's libraries: `pip install distrax`.
"""
import time

START = time.time()
import json  # noqa: E402
import sys  # noqa: E402
import types  # noqa: E402

spec = json.loads(sys.argv[1])
sys.path.insert(0, str(spec["purejaxrl"]) + "/purejaxrl")
for name in ("brax", "brax.envs", "brax.envs.wrappers", "brax.envs.wrappers.training", "navix"):
    sys.modules.setdefault(name, types.ModuleType(name))
sys.modules["brax"].envs = sys.modules["brax.envs"]
training_wrappers = sys.modules["brax.envs.wrappers.training"]
training_wrappers.EpisodeWrapper = training_wrappers.AutoResetWrapper = object

import gymnax  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402


class FiveValueStep:
    """A gymnax 1.0 env whose step returns gymnax 0.0.9's (obs, state, reward, done, info)."""

    def __init__(self, env):
        self._env = env

    def __getattr__(self, name):
        return getattr(self._env, name)

    def step(self, key, state, action, params=None):
        obs, state, reward, terminated, truncated, info = self._env.step(key, state, action, params)
        return obs, state, reward, jnp.logical_or(terminated, truncated), info


gymnax_make = gymnax.make
gymnax.make = lambda *args, **kwargs: (lambda env, params: (FiveValueStep(env), params))(*gymnax_make(*args, **kwargs))
import ppo  # noqa: E402  (PureJaxRL's)

# purejaxrl/ppo.py's __main__ config, DEBUG off (its per-episode prints)
CONFIG = {"LR": 2.5e-4, "NUM_ENVS": 4, "NUM_STEPS": 128, "TOTAL_TIMESTEPS": spec["env_steps"], "UPDATE_EPOCHS": 4,
          "NUM_MINIBATCHES": 4, "GAMMA": 0.99, "GAE_LAMBDA": 0.95, "CLIP_EPS": 0.2, "ENT_COEF": 0.01, "VF_COEF": 0.5,
          "MAX_GRAD_NORM": 0.5, "ACTIVATION": "tanh", "ENV_NAME": "CartPole-v1", "ANNEAL_LR": True, "DEBUG": False}
keys = jax.random.split(jax.random.PRNGKey(spec["seed"]), spec["seeds"])
train = jax.jit(jax.vmap(ppo.make_train(dict(CONFIG))))
started = time.time()
compiled = train.lower(keys).compile()
compile_seconds = time.time() - started
started = time.time()
out = jax.block_until_ready(compiled(keys))
run_seconds = time.time() - started
env, env_params = gymnax_make(CONFIG["ENV_NAME"])
network = ppo.ActorCritic(env.action_space(env_params).n, activation=CONFIG["ACTIVATION"])


def greedy_return(params, key):
    """One episode with the policy's argmax, to its end (at most 500 steps)."""
    obs, state = env.reset(key, env_params)

    def step(carry, step_key):
        obs, state, total, alive = carry
        policy, _ = network.apply(params, obs)
        obs, state, reward, terminated, truncated, _ = env.step(step_key, state, jnp.argmax(policy.logits),
                                                                env_params)
        return (obs, state, total + reward * alive, alive * (1.0 - jnp.logical_or(terminated, truncated))), None

    (_, _, total, _), _ = jax.lax.scan(step, (obs, state, 0.0, 1.0), jax.random.split(key, 500))
    return total


episode_keys = jax.random.split(jax.random.PRNGKey(spec["seed"] + 1), spec["episodes"])
finals = jax.jit(jax.vmap(lambda params: jax.vmap(greedy_return, (None, 0))(params, episode_keys).mean()))(
    out["runner_state"][0].params)
updates = CONFIG["TOTAL_TIMESTEPS"] // CONFIG["NUM_STEPS"] // CONFIG["NUM_ENVS"]
print(json.dumps({"finals": [float(f) for f in finals],
                  "env_steps": int(updates * CONFIG["NUM_STEPS"] * CONFIG["NUM_ENVS"]),
                  "compile_seconds": compile_seconds, "run_seconds": run_seconds,
                  "wall_seconds": time.time() - START}))
