"""Whole-state checkpoints with Orbax: written atomically, the newest complete one restored.

The device state (params, optimizer, target, replay, env states, keys, counters) is one pytree;
each seed's best policy (host arrays) a second; the host loop's own state (env steps, chunk,
evaluation history, metrics lines written) goes beside them as JSON, so a resumed run continues
exactly where the checkpoint was taken.
"""
import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any, Optional

import jax
import numpy as np
from jax.experimental import multihost_utils

from framework.errors import ConfigError
from framework.parallel import to_devices, to_host

CHECKPOINT_DIR = "checkpoints"


def _orbax() -> Any:
    """Orbax, imported when a Checkpointer is made (~0.2 s that runs without checkpoints skip)."""
    import orbax.checkpoint

    return orbax.checkpoint


def _is_key(leaf: Any) -> bool:
    return isinstance(leaf, jax.Array) and jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key)


def keys_to_data(state: Any) -> Any:
    """Typed PRNG keys become their uint32 data, which Orbax can store."""
    return jax.tree.map(lambda leaf: jax.random.key_data(leaf) if _is_key(leaf) else leaf, state)


def data_to_keys(restored: Any, template: Any) -> Any:
    """Put back the typed PRNG keys of `template` into a restored state."""
    return jax.tree.map(lambda data, leaf: jax.random.wrap_key_data(data, impl=jax.random.key_impl(leaf))
                        if _is_key(leaf) else data, restored, template)


DIGESTS = "lightspeed_digests.json"


def _file_digests(step_dir: Path) -> dict[str, str]:
    return {str(path.relative_to(step_dir)): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(step_dir.rglob("*")) if path.is_file() and path.name != DIGESTS}


def write_digests(step_dir: Path) -> None:
    """SHA-256 of every file of a finished checkpoint, written atomically beside them."""
    partial = step_dir / (DIGESTS + ".partial")
    partial.write_text(json.dumps(_file_digests(step_dir)))
    os.replace(partial, step_dir / DIGESTS)


def check_digests(step_dir: Path) -> None:
    """Raises when a file of the checkpoint is missing, truncated or changed since it was written."""
    if not (step_dir / DIGESTS).exists():
        return  # killed between Orbax's commit and the digests: Orbax's own read is the check
    expected, found = json.loads((step_dir / DIGESTS).read_text()), _file_digests(step_dir)
    damaged = sorted(name for name, digest in expected.items() if found.get(name) != digest)
    if damaged:
        raise OSError(f"{len(damaged)} file(s) missing or changed since written, e.g. {damaged[0]}")


def saved_steps(run_dir: Path) -> list[int]:
    """Env steps of the checkpoints in `run_dir` (as the first process sees them)."""
    directory = run_dir / CHECKPOINT_DIR
    steps = sorted(int(p.name) for p in directory.iterdir() if p.is_dir() and p.name.isdigit()) if directory.is_dir() else []
    return _json_from_first_process(steps if jax.process_index() == 0 else None)


def refuse_to_overwrite(run_dir: Path) -> None:
    """A fresh run must not overwrite (or later mix with) an earlier run's checkpoints in its run dir."""
    steps = saved_steps(run_dir)
    if steps:
        raise ConfigError("resume", False, "true, to continue that run; or another hydra.run.dir, to start over",
                          f"{run_dir / CHECKPOINT_DIR} holds an earlier run's checkpoints, the newest at env step "
                          f"{steps[-1]:,}, which a fresh run would overwrite")


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
            ocp = _orbax()
            only_this_process = ocp.options.MultiprocessingOptions(primary_host=0, active_processes={0})
            options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=False, enable_async_checkpointing=False,
                                                   multiprocessing_options=only_this_process)
            directory = (run_dir / CHECKPOINT_DIR).absolute()
            directory.mkdir(parents=True, exist_ok=True)  # Orbax cannot create it when limited to one process
            self.manager = ocp.CheckpointManager(directory, options=options)

    def latest_step(self) -> Optional[int]:
        return _json_from_first_process(self.manager.latest_step() if self.writer else None)

    def save(self, step: int, state: Any, host_state: dict, policies: Any) -> None:
        """The device state, the host loop's JSON state and the host-side best policies, as one checkpoint."""
        host_arrays = to_host(keys_to_data(state))
        if self.writer:
            ocp = _orbax()
            args = ocp.args.Composite(state=ocp.args.StandardSave(host_arrays), host=ocp.args.JsonSave(host_state),
                                      policies=ocp.args.StandardSave(policies))
            self.manager.save(step, args=args, force=True)
            self.manager.wait_until_finished()
            write_digests(self._step_dir(step))

    def restore_latest(self, template: Any, policies_template: Any) -> tuple[Any, Any, dict]:
        """The newest checkpoint's state (shaped and sharded like `template`), policies (host arrays) and host state."""
        template_data = keys_to_data(template)
        host_arrays = jax.tree.map(lambda leaf: np.zeros(leaf.shape, leaf.dtype), template_data)
        policies, host_state = policies_template, None
        if self.writer:
            host_arrays, policies, host_state = self._restore_newest_readable(host_arrays, policies_template)
        host_arrays, policies = _from_first_process((host_arrays, policies))
        return (data_to_keys(to_devices(host_arrays, template_data), template), policies,
                _json_from_first_process(host_state))

    def _restore_newest_readable(self, host_template: Any, policies_template: Any) -> tuple[Any, Any, dict]:
        """The newest checkpoint that reads back; a damaged one is reported and the one before it used."""
        ocp = _orbax()
        for step in sorted(self.manager.all_steps(), reverse=True):
            try:
                check_digests(self._step_dir(step))  # before Orbax, whose threads print noise on a bad read
                restored = self.manager.restore(step, args=ocp.args.Composite(
                    state=ocp.args.StandardRestore(host_template), host=ocp.args.JsonRestore(),
                    policies=ocp.args.StandardRestore(policies_template)))
                as_numpy = lambda tree: jax.tree.map(np.asarray, tree)
                return as_numpy(restored["state"]), as_numpy(restored["policies"]), dict(restored["host"])
            except Exception as error:  # truncated or corrupted files: fall back rather than lose the run
                aside = self._move_aside(step)
                print(f"warning: checkpoint {step} cannot be read ({type(error).__name__}: "
                      f"{str(error).splitlines()[0][:200]}); moved to {aside}, trying the one before it",
                      file=sys.stderr, flush=True)
        raise ConfigError("resume", True, "a run dir with at least one readable checkpoint",
                          f"none of {sorted(self.manager.all_steps())} in {self.manager.directory} can be read")

    def _step_dir(self, step: int) -> Path:
        return Path(self.manager.directory) / str(step)

    def _move_aside(self, step: int) -> Path:
        """Out of Orbax's sight (the resumed run will write this step again), but kept for inspection."""
        directory = Path(self.manager.directory)
        aside = directory.parent / f"{CHECKPOINT_DIR}_unreadable" / str(step)
        aside.parent.mkdir(exist_ok=True)
        (directory / str(step)).rename(aside)
        self.manager.reload()
        return aside

    def close(self) -> None:
        if self.manager is not None:
            self.manager.close()
