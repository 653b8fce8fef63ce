"""Whole-state checkpoints with Orbax: written atomically, the newest complete one restored.

The device state (params, optimizer, target, replay, env states, keys, counters) is one pytree;
the host loop's own state (env steps, chunk, evaluation history, metrics lines written) goes
beside it as JSON, so a resumed run continues exactly where the checkpoint was taken.
"""
import json
from pathlib import Path
from typing import Any, Optional

import jax
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

from framework.parallel import to_host

CHECKPOINT_DIR = "checkpoints"


def _is_key(leaf: Any) -> bool:
    return isinstance(leaf, jax.Array) and jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key)


def keys_to_data(state: Any) -> Any:
    """Typed PRNG keys become their uint32 data, which Orbax can store."""
    return jax.tree.map(lambda leaf: jax.random.key_data(leaf) if _is_key(leaf) else leaf, state)


def data_to_keys(restored: Any, template: Any) -> Any:
    """Put back the typed PRNG keys of `template` into a restored state."""
    return jax.tree.map(lambda data, leaf: jax.random.wrap_key_data(data, impl=jax.random.key_impl(leaf))
                        if _is_key(leaf) else data, restored, template)


def _from_first_process(tree: Any) -> Any:
    """Process 0's values of a host pytree on every process (the others pass same-shaped arrays)."""
    if jax.process_count() == 1:
        return tree
    return multihost_utils.broadcast_one_to_all(tree)


def _json_from_first_process(value: Any) -> Any:
    encoded = np.frombuffer(json.dumps(value).encode(), np.uint8)
    length = int(_from_first_process(np.int32(len(encoded))))
    return json.loads(bytes(_from_first_process(np.resize(encoded, length))).decode())


class Checkpointer:
    """Saves synchronously (the next chunk donates the state's buffers) and keeps the newest few.

    The state is gathered to host memory and only process 0 writes, so several hosts need no
    shared filesystem; on resume process 0 reads and every process takes its devices' blocks.
    """

    def __init__(self, run_dir: Path, keep: int):
        self.writer = jax.process_index() == 0
        self.manager = None
        if self.writer:
            only_this_process = ocp.options.MultiprocessingOptions(primary_host=0, active_processes={0})
            options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=False, enable_async_checkpointing=False,
                                                   multiprocessing_options=only_this_process)
            directory = (run_dir / CHECKPOINT_DIR).absolute()
            directory.mkdir(parents=True, exist_ok=True)  # Orbax cannot create it when limited to one process
            self.manager = ocp.CheckpointManager(directory, options=options)

    def latest_step(self) -> Optional[int]:
        return _json_from_first_process(self.manager.latest_step() if self.writer else None)

    def save(self, step: int, state: Any, host_state: dict) -> None:
        host_arrays = to_host(keys_to_data(state))
        if self.writer:
            args = ocp.args.Composite(state=ocp.args.StandardSave(host_arrays), host=ocp.args.JsonSave(host_state))
            self.manager.save(step, args=args, force=True)
            self.manager.wait_until_finished()

    def restore_latest(self, template: Any) -> tuple[Any, dict]:
        """The newest checkpoint's state (shaped and sharded like `template`) and host state."""
        template_data = keys_to_data(template)
        host_arrays = jax.tree.map(lambda leaf: np.zeros(leaf.shape, leaf.dtype), template_data)
        host_state = None
        if self.writer:
            restored = self.manager.restore(self.manager.latest_step(), args=ocp.args.Composite(
                state=ocp.args.StandardRestore(host_arrays), host=ocp.args.JsonRestore()))
            host_arrays, host_state = jax.tree.map(np.asarray, restored["state"]), dict(restored["host"])
        host_arrays = _from_first_process(host_arrays)
        on_devices = jax.tree.map(
            lambda data, leaf: jax.make_array_from_callback(leaf.shape, leaf.sharding, lambda index: data[index]),
            host_arrays, template_data)
        return data_to_keys(on_devices, template), _json_from_first_process(host_state)

    def close(self) -> None:
        if self.manager is not None:
            self.manager.close()
