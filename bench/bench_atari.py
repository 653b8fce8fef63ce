"""Atari on this machine (env=atari): the engine, the actors, the conv learner and the whole system, in one run.

    python bench/bench_atari.py [--games Pong Breakout] [--envs 32] [--window 60] [--windows 3] [--skip-system]

1. engine alone: ale-py's AtariVectorEnv with `--envs` envs stepped with random actions, synchronously (every env
   each call) and asynchronously (send/recv, half the envs per call, the other half stepping meanwhile).
2. actors with their policy: `Actor.block` of Ape-X's actor part (the Nature network, one jitted call per vector
   step: record the step into the n-step windows, act on the next frames) over the same `--envs` envs, the
   parameters fixed, no learner; in one actor thread, and in two (runtime.num_actor_threads=2) owning half the
   envs each, which overlaps one half's engine step with the other's policy call.
3. the conv learner: one learner batch of the Nature DQN network (Ape-X's dueling double-Q, batch 32 and 512)
   inside a `lax.scan` of updates as the learner runs it, with flax's nn.Conv against this project's
   StridedConv (the same maths: tests/test_networks.py), interleaved rounds.
4. the whole system, free mode: Ape-X at the Ape-X paper's 0.8 samples per insert (algo_env=apex_atari's 2
   batches of 512 per 1,280 env steps) and DQN at CleanRL's 8 (one batch of 32 every 4 env steps), learning
   from 2,000 env steps, timed over `--windows` fixed windows of `--window` seconds once learning runs: frames/s
   (4 per env step) and learner batches/s, the median window.

Rates of 1-3 are the best of 3 rounds of at least a second; 4's windows are medians. The machine is shared:
compare ratios from one run. CleanRL's dqn_atari_jax.py is not run here (its code is not part of this
repository); bench/README.md says how it was run beside this script and what was edited.
"""
import argparse
import sys
import threading
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from bench_host import best_rate, host_run, log
from shared import REPO_ROOT, format_rate, print_machine, print_table

sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(REPO_ROOT / "tests"))
FRAMES_PER_STEP = 4


def engine_rows(game: str, num_envs: int) -> tuple[list[list[str]], float]:
    """Section 1; returns its rows and the synchronous rate (env steps/s)."""
    from ale_py.vector_env import AtariVectorEnv

    from envs.atari_env import rom_id

    rng = np.random.default_rng(0)
    sync = AtariVectorEnv(game=rom_id(game), num_envs=num_envs)
    sync.reset(seed=0)
    actions = lambda count: rng.integers(0, sync.single_action_space.n, count)
    sync_rate = best_rate(lambda: sync.step(actions(num_envs)), num_envs)
    sync.close()
    half = num_envs // 2
    asynchronous = AtariVectorEnv(game=rom_id(game), num_envs=num_envs, batch_size=half)
    asynchronous.reset(seed=0)  # the first half's observations; the other half steps while a half is acted on

    def async_step() -> None:
        asynchronous.send(actions(half))  # for the envs the last reset or recv returned
        asynchronous.recv()

    async_rate = best_rate(async_step, half)
    asynchronous.close()
    rows = [[f"{game}, {num_envs} envs", "1. engine alone, sync", format_rate(sync_rate),
             format_rate(FRAMES_PER_STEP * sync_rate), ""],
            ["", f"   engine alone, async (batches of {half})", format_rate(async_rate),
             format_rate(FRAMES_PER_STEP * async_rate), f"{async_rate / sync_rate:.2f}x sync"]]
    return rows, sync_rate


def atari_config(game: str, algo: str, num_envs: int, *overrides: str):
    from conftest import compose_config

    from framework.config import validated
    from framework.trainer import build

    # Ape-X: actors of 8 envs, rollouts of 20, batches of 512 at 0.8 samples per insert; DQN: a batch of 32 per
    # 4 env steps (8 samples per insert)
    apex_batches = max(1, round(0.8 * num_envs * 20 / 512))
    layout = ([f"algo.num_actors={num_envs // 8}", "algo.envs_per_actor=8",
               f"algo.learner_updates_per_iteration={apex_batches}"] if algo == "apex"
              else [f"algo.num_envs={num_envs}", f"algo.train_every={4 * num_envs}",
                    f"algo.updates_per_train={num_envs}"])
    train = validated(compose_config(f"algo={algo}", "env=atari", f"env.id={game}", "algo.buffer_size=100000",
                                     "algo.learning_starts=2000", *layout, *overrides))
    env, _, algorithm = build(train)
    return train, env, algorithm


def actor_rate(game: str, num_envs: int, threads: int) -> float:
    """Env steps/s of Ape-X's actor loop with fixed parameters, `threads` actor threads blocking at once."""
    train, env, algorithm = atari_config(game, "apex", num_envs, f"runtime.num_actor_threads={threads}")
    run = host_run(train, env, algorithm)
    fixed = run.store.latest()
    block = lambda actor: jax.block_until_ready(actor.block(0, lambda: fixed, lambda: fixed[1]))

    def every_thread() -> None:
        workers = [threading.Thread(target=block, args=(actor,)) for actor in run.actors]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()

    try:
        every_thread()  # compiles
        return best_rate(every_thread, num_envs * run.parts.block_steps)
    finally:
        run.close()


def actor_rows(game: str, num_envs: int, engine_rate: float) -> list[list[str]]:
    """Section 2, in one thread and in two owning half the env columns each (the engine steps in C++ without the
    GIL, so one half steps while the other's policy runs)."""
    rows = []
    for threads in (1, 2):
        rate = actor_rate(game, num_envs, threads)
        rows.append(["", f"2. actors with their policy, {threads} thread{'s' * (threads > 1)}", format_rate(rate),
                     format_rate(FRAMES_PER_STEP * rate), f"{rate / engine_rate:.0%} of the sync engine"])
    return rows


def learner_rows(batch_sizes: tuple[int, ...] = (32, 512), updates: int = 4) -> list[list[str]]:
    """Section 3: Ape-X's Nature network updates in a scan, nn.Conv against StridedConv, interleaved rounds."""
    import flax.linen as nn

    from algorithms.common.networks import NATURE_LAYERS, StridedConv
    from algorithms.common.targets import huber, td_errors

    def flax_conv(features: int, size: int, stride: int) -> nn.Module:
        return nn.Conv(features, (size, size), (stride, stride), padding="VALID")

    class DuelingNature(nn.Module):  # QNetwork's "nature" torso and dueling head, with the convolution to compare
        conv: Any

        @nn.compact
        def __call__(self, obs):
            features = obs.astype(jnp.float32) / 255.0
            for filters, size, stride in NATURE_LAYERS:
                features = nn.relu(self.conv(filters, size, stride)(features))
            features = nn.relu(nn.Dense(512)(features.reshape(features.shape[0], -1)))
            value, advantages = nn.Dense(1)(features), nn.Dense(6)(features)
            return value + advantages - advantages.mean(axis=-1, keepdims=True)

    def program(conv, batch_size):
        network = DuelingNature(conv)
        obs = jnp.zeros((batch_size, 84, 84, 4), jnp.uint8)
        params = network.init(jax.random.key(0), obs)
        batch = {"obs": obs, "bootstrap_obs": obs, "action": jnp.zeros(batch_size, jnp.int32),
                 "n_step_return": jnp.ones(batch_size), "bootstrap_discount": jnp.full(batch_size, 0.99)}
        optimizer = optax.adam(1e-4)

        def update(carry, _):
            params, opt_state = carry
            loss = lambda p: huber(td_errors(p, params, batch, network, True)[0]).mean()
            grads = jax.grad(loss)(params)
            steps, opt_state = optimizer.update(grads, opt_state, params)
            return (optax.apply_updates(params, steps), opt_state), None

        compiled = jax.jit(lambda carry: jax.lax.scan(update, carry, None, length=updates)[0])
        carry = [jax.block_until_ready(compiled((params, optimizer.init(params))))]

        def run():
            carry[0] = jax.block_until_ready(compiled(carry[0]))
        return run

    rows = []
    for batch_size in batch_sizes:
        runs = {"nn.Conv": program(flax_conv, batch_size), "StridedConv": program(StridedConv, batch_size)}
        best = dict.fromkeys(runs, 0.0)
        for _ in range(3):
            for name, run in runs.items():
                best[name] = max(best[name], best_rate(run, updates, rounds=1))
        rows += [["", f"3. learner, batch {batch_size}, flax nn.Conv", "", "", f"{best['nn.Conv']:.2f} batches/s"],
                 ["", f"   learner, batch {batch_size}, StridedConv", "", "",
                  f"{best['StridedConv']:.2f} batches/s: {best['StridedConv'] / best['nn.Conv']:.1f}x nn.Conv"]]
    return rows


def drain(reports) -> None:
    """The learner's reports, consumed until the run stops (the bench evaluates nothing)."""
    from framework.runtime import RuntimeStopped

    while True:
        try:
            reports.get(timeout=1.0)
        except TimeoutError:
            continue
        except RuntimeStopped:
            return


def system_row(game: str, algo: str, num_envs: int, window: float, windows: int) -> list[str]:
    """Section 4: a free-mode run, its rates over fixed windows once the learner has started."""
    from framework.host_trainer import start_learner
    from framework.runtime import BoundedQueue, StopSignal

    train, env, algorithm = atari_config(game, algo, num_envs, "total_env_steps=100000000", "eval_every=100000000",
                                         "log_every=100000000")
    run = host_run(train, env, algorithm)
    reports, stop = BoundedQueue(4), StopSignal()
    learner = start_learner(run, reports, stop)
    threading.Thread(target=drain, args=(reports,), daemon=True).start()
    try:
        while run.learner_updates == 0:
            stop.raise_if_failed()
            time.sleep(0.5)
        marks = []
        for _ in range(windows + 1):
            marks.append((time.perf_counter(), run.rounds_inserted * run.block_items, run.learner_updates))
            time.sleep(window)
        stop.raise_if_failed()
    finally:
        run.stop_requested = True
        stop.stop("the bench ended")
        learner.join(60)
        run.close()
    # (seconds, env steps, learner updates) at each mark -> each window's env steps/s and batches/s
    deltas = np.diff(np.array(marks, float), axis=0)
    env_rate, batches = np.median(deltas[:, 1] / deltas[:, 0]), np.median(deltas[:, 2] / deltas[:, 0])
    label = "Ape-X, 0.8 samples per insert" if algo == "apex" else "DQN, 8 samples per insert"
    return ["", f"4. system, {label}", format_rate(env_rate), format_rate(FRAMES_PER_STEP * env_rate),
            f"{batches:.2f} batches/s of {train.algo.batch_size}, median of {windows} x {window:.0f} s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--games", nargs="+", default=["Pong", "Breakout"])
    parser.add_argument("--envs", type=int, default=32, help="envs of the engine and the actors (a multiple of 8)")
    parser.add_argument("--window", type=float, default=60.0)
    parser.add_argument("--windows", type=int, default=3)
    parser.add_argument("--skip-system", action="store_true")
    args = parser.parse_args()

    print_machine("lightspeed on Atari (env=atari, ale-py)")
    rows = []
    for game in args.games:
        log(f"{game}: 1. engine")
        engine, engine_rate = engine_rows(game, args.envs)
        log(f"{game}: 2. actors")
        rows += [*engine, *actor_rows(game, args.envs, engine_rate)]
        if not args.skip_system:
            for algo in ("apex", "dqn"):
                log(f"{game}: 4. system, {algo}")
                rows.append(system_row(game, algo, args.envs, args.window, args.windows))
    log("3. learner")
    rows += learner_rows()
    print_table("Atari: env steps/s and frames/s over all envs (one actor thread), learner batches/s",
                ["run", "stage", "env steps/s", "frames/s", "notes"], rows)


if __name__ == "__main__":
    main()
