"""Whole-state checkpoints with Orbax: written atomically, the newest complete one restored.

The device state (params, optimizer, target, replay, env states, keys, counters) is one pytree;
the host loop's own state (env steps, chunk, evaluation history, metrics lines written) goes
beside it as JSON, so a resumed run continues exactly where the checkpoint was taken.
"""
from pathlib import Path
from typing import Any, Optional

import jax
import orbax.checkpoint as ocp

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


class Checkpointer:
    """Saves synchronously (the next chunk donates the state's buffers) and keeps the newest few."""

    def __init__(self, run_dir: Path, keep: int):
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True, enable_async_checkpointing=False)
        self.manager = ocp.CheckpointManager((run_dir / CHECKPOINT_DIR).absolute(), options=options)

    def latest_step(self) -> Optional[int]:
        return self.manager.latest_step()

    def save(self, step: int, state: Any, host_state: dict) -> None:
        args = ocp.args.Composite(state=ocp.args.StandardSave(keys_to_data(state)), host=ocp.args.JsonSave(host_state))
        self.manager.save(step, args=args, force=True)
        self.manager.wait_until_finished()

    def restore_latest(self, template: Any) -> tuple[Any, dict]:
        """The newest checkpoint's state (shaped and sharded like `template`) and host state."""
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, keys_to_data(template))
        step = self.manager.latest_step()
        restored = self.manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract), host=ocp.args.JsonRestore()))
        return data_to_keys(restored["state"], template), dict(restored["host"])

    def close(self) -> None:
        self.manager.close()
