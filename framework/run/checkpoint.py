"""Whole-state checkpoints with Orbax: written atomically, the newest complete one restored.

The device state (params, optimizer, target, replay, env states, keys, counters) is one pytree;
each seed's best policy (host arrays) a second; the host loop's own state (env steps, chunk,
evaluation history, metrics lines written) goes beside them as JSON, so a resumed run continues
exactly where the checkpoint was taken.
"""
import hashlib
import json
import os
import re
import sys
from pathlib import Path
from typing import Any, Optional

import jax
import numpy as np
from jax.experimental import multihost_utils

from lightspeed.framework.core.devices import to_devices, to_host
from lightspeed.framework.core.errors import ConfigError

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


def check_digests(step_dir: Path) -> bool:
    """Raises when a file of the checkpoint is missing, truncated or changed since it was written;
    True when every file was verified, False when the checkpoint has no digests to check."""
    if not (step_dir / DIGESTS).exists():
        return False  # killed between Orbax's commit and the digests: Orbax's own read is the check
    expected, found = json.loads((step_dir / DIGESTS).read_text()), _file_digests(step_dir)
    damaged = sorted(name for name, digest in expected.items() if found.get(name) != digest)
    if damaged:
        raise OSError(f"{len(damaged)} file(s) missing or changed since written, e.g. {damaged[0]}")
    return True


def saved_steps(run_dir: Path) -> list[int]:
    """Env steps of the checkpoints in `run_dir` (as the first process sees them)."""
    directory = run_dir / CHECKPOINT_DIR
    steps = (sorted(int(p.name) for p in directory.iterdir() if p.is_dir() and p.name.isdigit())
             if directory.is_dir() else [])
    return _json_from_first_process(steps if jax.process_index() == 0 else None)


def refuse_to_overwrite(run_dir: Path) -> None:
    """A fresh run must not overwrite (or later mix with) an earlier run's checkpoints in its run dir."""
    steps = saved_steps(run_dir)
    if steps:
        raise ConfigError("resume", False, "true, to continue that run; or another hydra.run.dir, to start over",
                          f"{run_dir / CHECKPOINT_DIR} holds an earlier run's checkpoints, the newest at env step "
                          f"{steps[-1]:,}, which a fresh run would overwrite")


# what shapes the training state, or what it means: a resumed run must match the run dir's config in all of it
STATE_KEYS = ("algo", "env", "seed", "num_seeds", "num_devices", "distributed.num_processes")


def _flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dicts -> {"a.b.c": leaf}; an empty dict is a leaf of its own."""
    if not isinstance(tree, dict) or not tree:
        return {prefix.rstrip("."): tree}
    flat = {}
    for name, child in tree.items():
        flat.update(_flatten(child, f"{prefix}{name}."))
    return flat


def state_config(config: dict) -> dict[str, Any]:
    """The resolved config's state-shaping keys, dotted: {"algo.hidden_sizes": [64, 64], ...}."""
    return {key: value for key, value in _flatten(config).items()
            if any(key == k or key.startswith(k + ".") for k in STATE_KEYS)}


def interpolated_keys(config: Any) -> set[str]:
    """Dotted keys of an OmegaConf config whose value is another key's (`${total_env_steps}`; not
    resolvers such as `${oc.env:...}`)."""
    from omegaconf import OmegaConf

    raw = _flatten(OmegaConf.to_container(config, resolve=False))
    return {key for key, value in raw.items()
            if isinstance(value, str) and re.fullmatch(r"\$\{[\w.]+\}", value)}


def config_differences(saved: dict, new: dict, follows: set[str] = frozenset()) -> list[str]:
    """"key=saved in the run dir, new now" for every state-shaping key the two resolved configs disagree
    on; keys in `follows` are interpolations (a schedule as long as the run) that move with their source."""
    saved, new = state_config(saved), state_config(new)
    missing = "(not set)"
    differing = [key for key in sorted(set(saved) | set(new))
                 if saved.get(key, missing) != new.get(key, missing) and key not in follows]
    # another algorithm or env differs in all of its keys: its name says it
    renamed = [group for group in ("algo", "env") if f"{group}.name" in differing]
    differing = [key for key in differing if key.split(".")[0] not in renamed or key.endswith(".name")]
    return [f"{key}={saved.get(key, missing)!r} in the run dir, {new.get(key, missing)!r} now" for key in differing]


def check_resumable(run_dir: Path, new_config: Any) -> None:
    """Before anything is restored: the run dir's saved config and this one (an OmegaConf config) must
    build the same state. A longer `total_env_steps` is fine, and so are the schedules that follow it.

    Checked by the first process (the one that holds the run dir) and its answer shared with the others.
    """
    from omegaconf import OmegaConf

    differences = None
    if jax.process_index() == 0 and (run_dir / "config.yaml").is_file():
        import yaml

        differences = config_differences(yaml.safe_load((run_dir / "config.yaml").read_text()),
                                         OmegaConf.to_container(new_config, resolve=True),
                                         interpolated_keys(new_config))
    differences = _json_from_first_process(differences)
    if differences:
        raise ConfigError("resume", True, "the run dir's own config for every key that shapes the training state "
                          f"({', '.join(STATE_KEYS)}); or resume=false with another hydra.run.dir to start over",
                          f"{len(differences)} key(s) differ from {run_dir / 'config.yaml'}: {'; '.join(differences)}. "
                          "No checkpoint was read or changed")


def _from_first_process(tree: Any) -> Any:
    """Process 0's values of a host pytree on every process (the others pass same-shaped arrays)."""
    if jax.process_count() == 1:
        return tree
    return multihost_utils.broadcast_one_to_all(tree)


def _json_from_first_process(value: Any) -> Any:
    encoded = np.frombuffer(json.dumps(value).encode(), np.uint8)
    length = int(_from_first_process(np.int32(len(encoded))))
    return json.loads(bytes(_from_first_process(np.resize(encoded, length))).decode())


def _first_shape_mismatch(restored: Any, template: Any) -> Optional[str]:
    for (where, saved), expected in zip(jax.tree_util.tree_leaves_with_path(restored), jax.tree.leaves(template),
                                        strict=True):
        if saved.shape != expected.shape:
            return (f"{jax.tree_util.keystr(where)} is {saved.shape} in the checkpoint, {expected.shape} in this run: "
                    "the devices (num_devices, XLA_FLAGS), seeds or algorithm config differ")
    return None


def _does_not_fit(step: int, reason: str) -> ConfigError:
    return ConfigError("resume", True, "the layout and config the checkpoints were written with",
                       f"checkpoint {step} is intact but does not fit this run's state ({reason}); "
                       "no checkpoint was changed")


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
        """The newest checkpoint that reads back; a damaged one is reported, moved aside and the one before
        it used. An intact one (its digests verified) that does not fit this run is this run's error."""
        ocp = _orbax()
        for step in sorted(self.manager.all_steps(), reverse=True):
            try:
                verified = check_digests(self._step_dir(step))  # before Orbax, whose threads print noise on a bad read
            except OSError as error:
                self._set_aside(step, error)
                continue
            try:
                restored = self.manager.restore(step, args=ocp.args.Composite(
                    state=ocp.args.StandardRestore(host_template), host=ocp.args.JsonRestore(),
                    policies=ocp.args.StandardRestore(policies_template)))
            except Exception as error:  # truncated or corrupted files: fall back rather than lose the run
                if verified:
                    raise _does_not_fit(step, f"{type(error).__name__}: {str(error).splitlines()[0][:200]}") from None
                self._set_aside(step, error)
                continue
            as_numpy = lambda tree: jax.tree.map(np.asarray, tree)
            state, policies = as_numpy(restored["state"]), as_numpy(restored["policies"])
            mismatch = _first_shape_mismatch({"state": state, "policies": policies},
                                            {"state": host_template, "policies": policies_template})
            if mismatch:  # Orbax restores numpy arrays in their saved shapes, whatever the template's
                raise _does_not_fit(step, mismatch)
            return state, policies, dict(restored["host"])
        raise ConfigError("resume", True, "a run dir with at least one readable checkpoint",
                          f"none of the checkpoints in {self.manager.directory} can be read")

    def _set_aside(self, step: int, error: Exception) -> None:
        aside = self._move_aside(step)
        print(f"warning: checkpoint {step} cannot be read ({type(error).__name__}: "
              f"{str(error).splitlines()[0][:200]}); moved to {aside}, trying the one before it",
              file=sys.stderr, flush=True)

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
