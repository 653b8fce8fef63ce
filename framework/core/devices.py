"""Devices and processes: the mesh the trainer runs on and the collectives a learner may use.

Two layouts share one device axis:
- seed-parallel (tabular Q, DQN): the seeds are split over the devices; no algorithm code sees
  the axis.
- learner-parallel (Ape-X): every device holds a full copy of every seed (its own actors and
  replay shard) and the learners average their gradients with `mean_over_devices`, so the
  parameters stay identical on all devices. The state is laid out [device, seed, ...].
"""
import contextlib
import math
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.flatten_util import ravel_pytree
from jax.sharding import Mesh

from lightspeed.framework.core.errors import ConfigError, check, check_writable_dir

DEVICE_AXIS = "device"


def device_index() -> jax.Array:
    """Which learner this is (0 .. devices-1); only inside the trainer's learner-parallel program."""
    return jax.lax.axis_index(DEVICE_AXIS)


def num_learners() -> int:
    """How many learners share this seed (devices of the axis); only inside the learner-parallel program."""
    return jax.lax.axis_size(DEVICE_AXIS)


def mean_over_devices(tree: Any) -> Any:
    """The average over all learners (gradients); only inside the trainer's learner-parallel program.

    One all-reduce of the tree as a single vector, not one per leaf: across processes each collective
    costs milliseconds whatever its size. Each element is reduced as before, so the result is the same.
    """
    flat, unflatten = ravel_pytree(tree)
    return unflatten(jax.lax.pmean(flat, DEVICE_AXIS))


def make_mesh(num_seeds: int, learners: bool, num_devices: Optional[int]) -> Mesh:
    """Learners use every chosen device; independent seeds use as many as divide them evenly."""
    devices = jax.devices()[: num_devices or jax.device_count()]
    if not learners:
        devices = devices[: math.gcd(num_seeds, len(devices))]
    return Mesh(np.array(devices), (DEVICE_AXIS,))


def check_num_devices(num_devices: Optional[int]) -> None:
    if num_devices is None:
        return
    available = jax.device_count()
    check(num_devices <= available, "num_devices", num_devices, f"at most the {available} devices JAX sees (null: all)",
          "set XLA_FLAGS=--xla_force_host_platform_device_count=N for N CPU devices")


def to_host(tree: Any) -> Any:
    """Numpy copies of (possibly multi-process) global arrays, on every process."""
    if jax.process_count() == 1:
        return jax.device_get(tree)
    return multihost_utils.process_allgather(tree, tiled=True)


def to_devices(host_tree: Any, like: Any) -> Any:
    """Host arrays (the same on every process) placed as the global arrays of `like` are."""
    return jax.tree.map(lambda data, leaf: jax.make_array_from_callback(leaf.shape, leaf.sharding,
                                                                        lambda index: data[index]),
                        host_tree, like)


def is_writer() -> bool:
    """Only the first process writes logs, checkpoints, plots and W&B."""
    return jax.process_index() == 0


def initialize_distributed(config: Any) -> None:  # framework.core.config.DistributedConfig
    """Join the cluster before any JAX computation; CPU collectives between processes use gloo."""
    if config.num_processes == 1 or jax.distributed.is_initialized():
        return
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    try:
        # the coordination service would listen on every interface ([::]:PORT) unless told where
        bind = config.bind_address or config.coordinator_address
        jax.distributed.initialize(config.coordinator_address, config.num_processes, config.process_id,
                                   initialization_timeout=config.initialization_timeout, coordinator_bind_address=bind)
    except Exception as error:  # the coordinator's own message says which process or port failed
        raise ConfigError("distributed.coordinator_address", config.coordinator_address,
                          f"an address where all {config.num_processes} processes meet",
                          str(error).splitlines()[0]) from None


@contextlib.contextmanager
def jax_options(compilation_cache: Optional[str], matmul_precision: Optional[str]) -> Iterator[None]:
    """A run's JAX options, set process-wide (its actor threads compile too) before anything compiles; the matmul
    precision is JAX's previous one again afterwards, so that an in-process run leaves the next one as it was."""
    previous = jax.config.jax_default_matmul_precision
    use_compilation_cache(compilation_cache)
    use_matmul_precision(matmul_precision)
    try:
        yield
    finally:
        jax.config.update("jax_default_matmul_precision", previous)


def use_matmul_precision(precision: Optional[str]) -> None:
    """Float32 matrix products at `precision` (null: JAX's default) in every program compiled from now on."""
    if precision is not None:
        jax.config.update("jax_default_matmul_precision", precision)


def use_compilation_cache(directory: Optional[str]) -> None:
    """Keep compiled programs on disk (null: off); checked before anything compiles."""
    if directory is None:
        return
    path = Path(directory).expanduser()
    check_writable_dir(path, "compilation_cache")
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)


def with_device_axis(fn: Callable) -> Callable:
    """`fn` as one learner on a device axis of size one (Ape-X's learner averages over that axis). The inputs stay
    unmapped: giving every leaf a leading axis of one made XLA copy the whole replay at each call (4x slower)."""
    on_axis = jax.vmap(fn, in_axes=None, axis_size=1, axis_name=DEVICE_AXIS)
    return lambda *args: jax.tree.map(lambda x: x[0], on_axis(*args))
