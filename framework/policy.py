"""Saved policies: each seed's greedy policy alone (not the training state), one small file per kind.

    <run dir>/policies/seed_<i>/final.msgpack   the policy the run ended with
    <run dir>/policies/seed_<i>/best.msgpack    its policy at its best periodic evaluation

Each file holds the policy's arrays (network parameters, a Q-table) and the resolved `algo` and
`env` config that rebuild the network and env around them, in Flax's msgpack encoding.
"""
import dataclasses
import os
from pathlib import Path
from typing import Any

import jax
import numpy as np
from flax import serialization

POLICY_DIR = "policies"


def policy_path(run_dir: Path, seed_index: int, which: str) -> Path:
    return Path(run_dir) / POLICY_DIR / f"seed_{seed_index}" / f"{which}.msgpack"


def write_atomically(path: Path, data: bytes) -> None:
    """A reader sees the old file or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_bytes(data)
    os.replace(partial, path)


def save_policies(run_dir: Path, which: str, policies: Any, train_cfg: Any) -> None:
    """One file per seed from host policies laid out [seed, ...]."""
    meta = {"algo": dataclasses.asdict(train_cfg.algo), "env": dataclasses.asdict(train_cfg.env), "kind": which}
    num_seeds = jax.tree.leaves(policies)[0].shape[0]
    for seed in range(num_seeds):
        policy = jax.tree.map(lambda leaf: np.asarray(leaf[seed]), policies)
        payload = {"policy": serialization.to_state_dict(policy), "meta": {**meta, "seed_index": seed}}
        write_atomically(policy_path(run_dir, seed, which), serialization.msgpack_serialize(payload))


def read_policy(run_dir: Path, seed_index: int, which: str) -> tuple[Any, dict]:
    """A saved policy's arrays (nested dicts, as Flax's state dicts) and its metadata."""
    payload = serialization.msgpack_restore(policy_path(run_dir, seed_index, which).read_bytes())
    return payload["policy"], payload["meta"]
