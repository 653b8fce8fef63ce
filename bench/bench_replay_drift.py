"""Prioritised replay over 10M priority updates: does sampling still follow the current priorities?

    python bench/bench_replay_drift.py [--updates 10_000_000]

Flashbax 0.1.3 updates its float32 sum tree by adding differences along each path, so the inner
nodes drift away from the sums of their leaves (flashbax issue 52). lightspeed's replay
(`algorithms/common/prioritized_replay.py`, used by Ape-X) recomputes every touched ancestor as
the sum of its two children instead. Both run here side by side on the same random updates:
batches of 512 random slots of a 2^17-slot buffer (Ape-X's 100k rounded up to the tree) get
priorities drawn log-uniformly from [1e-3, 1e3], raised to alpha = 0.6 by the buffer.

The sampling distribution is read off the stored tree exactly (in float64): the sampler draws
u * root and walks down comparing with left children, so a node passes on to its right child
whatever its incoming range minus the left child holds. That is compared with the truth,
leaf / sum(leaves), as the worst relative error over all items and over the items holding at
least the average mass 1/N, the total variation distance, and the root's relative error (which
scales every importance weight). Float32 cannot resolve an item far below the resolution of the
sums above it, even in a freshly built tree: the first column is large for both trees, and what
matters is how the two compare and whether the drift grows.
"""
import argparse
import sys
import time

import numpy as np
from shared import REPO_ROOT, print_machine, print_table

CAPACITY, BATCH, ALPHA = 2**17, 512, 0.6
BATCHES_PER_CALL = 64


def tree_sampling_probabilities(nodes: np.ndarray, depth: int) -> np.ndarray:
    """P(leaf) of flashbax's descent over these stored node values, in exact arithmetic."""
    nodes = nodes.astype(np.float64)
    ranges = nodes[:1]
    for level in range(1, depth + 1):
        left = nodes[2**level - 1: 2**(level + 1) - 1][0::2]
        to_left = np.minimum(left, ranges)
        ranges = np.stack([to_left, np.maximum(ranges - left, 0.0)], axis=1).reshape(-1)
    return ranges / nodes[0]


def compare(nodes: np.ndarray, depth: int) -> dict:
    leaves = nodes[2**depth - 1:].astype(np.float64)
    truth = leaves / leaves.sum()
    sampled = tree_sampling_probabilities(nodes, depth)
    relative_error = np.abs(sampled - truth) / truth
    return {"worst_relative_error": float(relative_error.max()),
            "worst_relative_error_common": float(relative_error[truth >= 1.0 / truth.size].max()),
            "total_variation": float(0.5 * np.abs(sampled - truth).sum()),
            "root_error": float(abs(nodes[0] - leaves.sum()) / leaves.sum())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=10_000_000, help="priority updates (in batches of 512)")
    parser.add_argument("--reports", type=int, default=5, help="rows of the table")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO_ROOT))
    import flashbax as fbx
    import jax
    import jax.numpy as jnp

    from lightspeed.algorithms.common.prioritized_replay import make_prioritized_replay

    print_machine("lightspeed prioritised-replay drift benchmark")
    ours = make_prioritized_replay(CAPACITY, 1, BATCH, ALPHA)
    flashbax = fbx.make_prioritised_trajectory_buffer(
        add_batch_size=1, sample_batch_size=BATCH, sample_sequence_length=1, period=1, min_length_time_axis=1,
        max_length_time_axis=CAPACITY, priority_exponent=ALPHA)
    empty = ours.init(jnp.zeros((), jnp.float32))
    filled = ours.add(empty, jnp.zeros((1, CAPACITY)), jnp.ones((1, CAPACITY)))
    batches_per_report = -(-args.updates // BATCH // args.reports)
    iterations = -(-batches_per_report // BATCHES_PER_CALL)

    def random_batch(key):
        index_key, value_key = jax.random.split(key)
        log_priority = jax.random.uniform(value_key, (BATCH,), minval=-3.0, maxval=3.0)
        return jax.random.randint(index_key, (BATCH,), 0, CAPACITY), 10.0 ** log_priority

    @jax.jit
    def run(states, key):
        def iteration(states, key):
            def one_batch(states, key):
                indices, priorities = random_batch(key)
                theirs, mine = states
                return (flashbax.set_priorities(theirs, indices, priorities),
                        ours.set_priorities(mine, indices, priorities)), None

            return jax.lax.scan(one_batch, states, jax.random.split(key, BATCHES_PER_CALL))[0], None

        return jax.lax.scan(iteration, states, jax.random.split(key, iterations))[0]

    states, key, rows, done = (filled, filled), jax.random.key(0), [], 0
    start = time.perf_counter()
    for report in range(args.reports):
        states = run(states, jax.random.fold_in(key, report))
        done += iterations * BATCHES_PER_CALL * BATCH
        depth = states[0].sum_tree_state.tree_depth
        for name, state in zip(("flashbax 0.1.3", "lightspeed"), states, strict=True):
            error = compare(np.asarray(state.sum_tree_state.nodes), depth)
            rows.append([f"{done:,}", name, *(f"{error[k]:.2e}" for k in (
                "worst_relative_error", "worst_relative_error_common", "total_variation", "root_error"))])
    seconds = time.perf_counter() - start
    print_table(f"Sampling distribution of the sum tree against the current priorities^{ALPHA} "
                f"({CAPACITY:,} slots, batches of {BATCH}; {seconds:.0f} s for both trees)",
                ["priority updates", "sum tree", "worst rel. error", "same, items >= 1/N", "total variation",
                 "root rel. error"], rows)


if __name__ == "__main__":
    main()
