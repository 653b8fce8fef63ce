"""Saved policies: each seed's greedy policy alone (not the training state), one small file per kind.

    <run dir>/policies/seed_<i>/final.msgpack   the policy the run ended with
    <run dir>/policies/seed_<i>/best.msgpack    its policy at its best periodic evaluation

Each file holds the policy's arrays (network parameters, a Q-table) and the facts that rebuild
the network and env around them (the resolved `algo` and `env` config, the observation shape and
the number of actions, the run's seed), in Flax's msgpack encoding.

    from lightspeed.framework.run.policy import load_policy
    policy = load_policy("runs/first", seed_index=0, which="final")
    action = policy(observation)          # one observation -> int; a batch [B, ...] -> [B] actions
"""
import contextlib
import dataclasses
import os
from pathlib import Path
from typing import Any, ContextManager, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np
from flax import serialization
from jax.sharding import Mesh, PartitionSpec

from lightspeed.framework.core import registry
from lightspeed.framework.core.algorithm import Algorithm
from lightspeed.framework.core.devices import DEVICE_AXIS
from lightspeed.framework.core.errors import ConfigError, check
from lightspeed.framework.core.evaluation import HostEpisodesAct
from lightspeed.framework.core.host_env import env_actions
from lightspeed.framework.core.spaces import Discrete

POLICY_DIR = "policies"
KINDS = ("final", "best")


def policy_path(run_dir: Path, seed_index: int, which: str) -> Path:
    return Path(run_dir) / POLICY_DIR / f"seed_{seed_index}" / f"{which}.msgpack"


def write_atomically(path: Path, data: bytes) -> None:
    """A reader sees the old file or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_bytes(data)
    os.replace(partial, path)


def acting_facts(algorithm: Algorithm, env: Any, env_params: Any) -> dict:
    """What a saved policy needs to act, for a reader of its file: the spaces, and the shapes of the policy
    state an episode carries (a recurrent state; empty for a feed-forward policy)."""
    state = jax.eval_shape(algorithm.act_init, jax.ShapeDtypeStruct((), np.int32))
    return {"observation_space": env.observation_space(env_params).describe(),
            "action_space": env.action_space(env_params).describe(),
            "policy_state": [[list(leaf.shape), str(leaf.dtype)] for leaf in jax.tree.leaves(state)]}


def save_policies(run_dir: Path, which: str, policies: Any, train_cfg: Any, env: Any, env_params: Any,
                  algorithm: Algorithm) -> None:
    """One file per seed from host policies laid out [seed, ...]."""
    meta = {"algo": dataclasses.asdict(train_cfg.algo), "env": dataclasses.asdict(train_cfg.env), "kind": which,
            "observation_shape": list(env.observation_shape),
            # Discrete actions' count (None for Box actions: action_space says what they are)
            "num_actions": env.num_actions if env.action_space(env_params).kind == "discrete" else None,
            "seed": train_cfg.seed, "num_seeds": train_cfg.num_seeds, "matmul_precision": train_cfg.matmul_precision,
            **acting_facts(algorithm, env, env_params)}
    for seed in range(train_cfg.num_seeds):
        policy = jax.tree.map(lambda leaf, seed=seed: np.asarray(leaf[seed]), policies)
        payload = {"policy": serialization.to_state_dict(policy), "meta": {**meta, "seed_index": seed}}
        write_atomically(policy_path(run_dir, seed, which), serialization.msgpack_serialize(payload))


def saved_seeds(run_dir: Path, which: str) -> int:
    """How many seeds' `which` policies the run dir holds; a one-paragraph error when it holds none."""
    run_dir = Path(run_dir)
    check(which in KINDS, "which", which, " or ".join(KINDS))
    check(run_dir.is_dir(), "run_dir", str(run_dir), "a run dir written by run.py", "no such directory")
    count = 0
    while policy_path(run_dir, count, which).is_file():
        count += 1
    check(count > 0, "run_dir", str(run_dir), f"a run dir that holds {POLICY_DIR}/seed_<i>/{which}.msgpack",
          "it holds no saved policies: the run did not finish, or was made before policies were saved")
    return count


META_KEYS = ("algo", "env", "seed", "num_seeds", "observation_shape", "num_actions", "seed_index")


def read_policy(run_dir: Path, seed_index: int, which: str) -> tuple[Any, dict]:
    """A saved policy's arrays (nested dicts, as Flax's state dicts) and its metadata."""
    path = policy_path(run_dir, seed_index, which)
    try:
        payload = serialization.msgpack_restore(path.read_bytes())
        policy, meta = payload["policy"], payload["meta"]
    except Exception as error:  # truncated or not ours: say which file, not where msgpack stopped
        raise ConfigError("run_dir", str(run_dir), "a run dir whose policy files read back",
                          f"{path} cannot be read: {type(error).__name__}") from None
    missing = [key for key in META_KEYS if key not in meta]
    check(not missing, "run_dir", str(run_dir), "policy files written by this version of run.py (train again)",
          f"{path} lacks {', '.join(missing)}: it was saved by an earlier version")
    return policy, meta


def _without_name(config: dict) -> dict:
    return {key: value for key, value in config.items() if key != "name"}


def rebuild(meta: dict) -> tuple[Any, Any, Algorithm]:
    """The env and algorithm a saved policy was trained with, from its own metadata."""
    env_config = registry.build_config("env", meta["env"]["name"], _without_name(meta["env"]))
    algo_config = registry.build_config("algo", meta["algo"]["name"], _without_name(meta["algo"]))
    return registry.build(env_config, algo_config)


def abstract_policy(algorithm: Algorithm, env: Any, env_params: Any = None) -> Any:
    """Shapes and dtypes of one seed's policy, traced from `init` (an algorithm written as parts: from its learner
    part's init), nothing computed."""
    parts = algorithm.actor_learner
    if algorithm.init is None:
        one_obs = (jax.ShapeDtypeStruct(env.observation_shape, env.observation_dtype) if getattr(env, "host", False)
                   else jax.eval_shape(lambda: env.reset_env(jax.random.key(0), env_params))[0])
        obs = jax.ShapeDtypeStruct((parts.num_envs, *one_obs.shape), one_obs.dtype)
        one_seed = lambda key: parts.actor_params(parts.learner_init(key, jnp.zeros(obs.shape, obs.dtype)))
    else:
        one_seed = lambda key: algorithm.policy(algorithm.init(key))
    if algorithm.parallel_learners:  # init reads its learner's index: trace it inside a one-device axis
        mesh = Mesh(np.array(jax.devices()[:1]), (DEVICE_AXIS,))
        one_seed = jax.shard_map(one_seed, mesh=mesh, in_specs=PartitionSpec(), out_specs=PartitionSpec(),
                                 check_vma=False)
    return jax.eval_shape(one_seed, jax.random.key(0))


def restore_arrays(template: Any, saved: Any, path: Path) -> Any:
    """The saved arrays in the template's structure; a one-paragraph error naming what does not fit."""
    not_fitting = lambda reason: ConfigError("run_dir", str(path.parent.parent.parent), "policy files that fit the "
                                             "algo and env config saved beside them", f"{path}: {reason}")
    try:
        policy = serialization.from_state_dict(template, saved)
    except (ValueError, KeyError, TypeError) as error:
        raise not_fitting(str(error).splitlines()[0][:200]) from None
    for (where, expected), actual in zip(jax.tree_util.tree_leaves_with_path(template), jax.tree.leaves(policy),
                                         strict=True):
        if tuple(np.shape(actual)) != expected.shape:
            raise not_fitting(f"{jax.tree_util.keystr(where)} has shape {tuple(np.shape(actual))}, "
                              f"the config builds {expected.shape}")
    return jax.tree.map(lambda leaf, like: np.asarray(leaf, like.dtype), policy, template)


class SavedPolicies(NamedTuple):
    """Every seed's saved policy of one kind, stacked [seed, ...], with the env and algorithm around them."""

    policies: Any
    meta: dict
    env: Any
    env_params: Any
    algorithm: Algorithm


def products_as_the_run(meta: dict) -> ContextManager:
    """The run's matmul precision (saved with its policies) for the programs compiled within: a policy acts on an
    accelerator as the run evaluated it (none saved: JAX's own)."""
    precision = meta.get("matmul_precision")
    return jax.default_matmul_precision(precision) if precision else contextlib.nullcontext()


def load_policies(run_dir: Path, which: str = "final") -> SavedPolicies:
    """All seeds' `which` policies of a run dir, checked against the config they were saved with."""
    saved = [read_policy(run_dir, seed, which) for seed in range(saved_seeds(run_dir, which))]
    meta = saved[0][1]
    env, env_params, algorithm = rebuild(meta)
    template = abstract_policy(algorithm, env, env_params)
    policies = [restore_arrays(template, arrays, policy_path(run_dir, seed, which))
                for seed, (arrays, _) in enumerate(saved)]
    return SavedPolicies(jax.tree.map(lambda *leaves: np.stack(leaves), *policies), meta, env, env_params, algorithm)


class LoadedPolicy:
    """A saved greedy policy as a function: one observation -> an action, a batch [B, ...] -> [B] actions.

    Observations are numpy arrays as the env hands them out (gymnasium's CartPole-v1 gives the same four floats
    as this project's CartPole). A Discrete action is an int (the space's own numbering), a Box action a float
    array of the space's shape within its bounds: what the env's `step` takes. The policy keeps its state (a
    recurrent one) between calls: its first call, and the first after `reset()`, begin an episode; or pass
    `start` (a bool, or [B] bools) where one begins. Jitted once per batch shape.
    """

    def __init__(self, algorithm: Algorithm, policy: Any, meta: dict, env: Any, env_params: Any):
        self.meta, self.env, self.env_params, self.algorithm = meta, env, env_params, algorithm
        self.policy = jax.device_put(policy)
        self.observation_shape = tuple(env.observation_shape)
        self.observation_dtype = (env.observation_dtype if getattr(env, "host", False)
                                  else jax.eval_shape(env.reset_env, jax.random.key(0), env_params)[0].dtype)
        self.action_space = env.action_space(env_params)
        self._acts: dict[int, HostEpisodesAct] = {}  # one per batch size, each with its episodes' states
        self._starting = True

    def reset(self) -> None:
        """The next call begins an episode (its policy state starts anew)."""
        self._starting = True

    def __call__(self, observation: Any, start: Any = None) -> Any:
        """The action for one observation, or [B] actions for a batch [B, ...]; `start` (a bool, or [B] bools):
        where an episode begins (default: at the first call and the first after `reset()`)."""
        batch = np.asarray(observation, dtype=self.observation_dtype)
        single = batch.shape == self.observation_shape
        batch = batch[None] if single else batch
        check(batch.shape[1:] == self.observation_shape, "observation", f"an array of shape {np.shape(observation)}",
              f"one observation of shape {self.observation_shape} "
              f"or a batch [B, {', '.join(map(str, self.observation_shape))}]")
        size = len(batch)
        start = np.broadcast_to(np.asarray(self._starting if start is None else start, bool), (size,))
        self._starting = False
        act = self._acts.setdefault(size, HostEpisodesAct(self.algorithm, (), size))
        with products_as_the_run(self.meta):
            actions = act(self.policy, batch, start, np.zeros(size, np.uint32))
        actions = env_actions(self.action_space, actions)
        return actions[0].item() if single and isinstance(self.action_space, Discrete) else (
            actions[0] if single else actions)


def load_policy(run_dir: Path | str, seed_index: int = 0, which: str = "final",
                agent_index: Optional[int] = None) -> LoadedPolicy:
    """The greedy policy of one seed of a finished run (`which`: "final" or "best").

    Tabular Q keeps a population of agents per seed: `agent_index` picks one (default 0).
    """
    num_seeds = saved_seeds(Path(run_dir), which)
    check(isinstance(seed_index, int) and 0 <= seed_index < num_seeds, "seed_index", seed_index,
          f"an integer from 0 to {num_seeds - 1} (the run's {num_seeds} seeds)")
    path = policy_path(Path(run_dir), seed_index, which)
    saved, meta = read_policy(Path(run_dir), seed_index, which)
    env, env_params, algorithm = rebuild(meta)
    policy = restore_arrays(abstract_policy(algorithm, env, env_params), saved, path)
    if algorithm.population_policy:
        members = jax.tree.leaves(policy)[0].shape[0]
        agent_index = 0 if agent_index is None else agent_index
        check(isinstance(agent_index, int) and 0 <= agent_index < members, "agent_index", agent_index,
              f"an integer from 0 to {members - 1} (algo={meta['algo']['name']} keeps {members} agents per seed)")
        policy = jax.tree.map(lambda leaf: leaf[agent_index:agent_index + 1], policy)
    else:
        check(agent_index is None, "agent_index", agent_index,
              f"None: algo={meta['algo']['name']} keeps one policy per seed")
    return LoadedPolicy(algorithm, policy, meta, env, env_params)
