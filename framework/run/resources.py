"""Will the run fit? Memory for the training state and disk for its checkpoints, checked before compiling."""
import os
import shutil
from pathlib import Path
from typing import Any, Optional

import jax

from lightspeed.framework.core.algorithm import Memory
from lightspeed.framework.core.errors import ConfigError

GIB = 2**30


def state_bytes(abstract_state: Any) -> tuple[int, str, int]:
    """Total bytes of a (shape-only) state, and the path and bytes of its largest array."""
    sizes = [(leaf.size * leaf.dtype.itemsize, jax.tree_util.keystr(path))
             for path, leaf in jax.tree_util.tree_leaves_with_path(abstract_state)]
    largest, where = max(sizes)
    return sum(size for size, _ in sizes), where, largest


def free_memory_bytes() -> Optional[int]:
    """Memory the OS can still give this process (Linux); None where it cannot say."""
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _key_to_reduce(largest_path: str, memory: Optional[Memory]) -> str:
    return memory.key if memory is not None and memory.path in largest_path else "num_seeds"


def check_fits(abstract_state: Any, run_dir: Path, checkpoints_kept: int, on_cpu: bool,
               memory: Optional[Memory] = None, free_memory: Optional[int] = None,
               free_disk: Optional[int] = None) -> None:
    """ConfigError when the state cannot fit in host memory (CPU runs), or its checkpoints on disk; the error
    names the key that sizes the algorithm's `memory` when that holds the largest array, else num_seeds."""
    total, largest_path, largest = state_bytes(abstract_state)
    free_memory = free_memory_bytes() if free_memory is None else free_memory
    if on_cpu and free_memory is not None and total > free_memory:
        key = _key_to_reduce(largest_path, memory)
        raise ConfigError(key, f"a {total / GIB:.1f} GiB training state",
                          f"a state that fits in the {free_memory / GIB:.1f} GiB of free memory",
                          f"{largest / GIB:.1f} GiB of it in {largest_path}")
    if checkpoints_kept:
        free_disk = shutil.disk_usage(run_dir).free if free_disk is None else free_disk
        # Orbax writes the new checkpoint before it deletes the oldest one
        needed = (checkpoints_kept + 1) * total
        if needed > free_disk:
            raise ConfigError("hydra.run.dir", str(run_dir), f"a directory with {needed / GIB:.2f} GiB free "
                              f"for checkpoint.keep + 1 = {checkpoints_kept + 1} checkpoints of {total / GIB:.2f} GiB",
                              f"only {free_disk / GIB:.2f} GiB free; lower checkpoint.keep or choose another run dir")
