"""Atari on this machine (env=atari): the engine, the actors, the conv learner and the whole system, in one run.

    python bench/bench_atari.py [--games Pong Breakout] [--envs 32] [--window 60] [--windows 3]
                                [--sections engine actors system learner] [--cleanrl DIR]

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

5. with `--cleanrl DIR` (a checkout of github.com/vwxyzjn/cleanrl; its code is not part of this repository):
   CleanRL's `dqn_atari_jax.py` on `<game>NoFrameskip-v4`, 20k steps, learning from 10k, a 20k buffer (8 samples
   per insert, as 4's DQN), timed over the same windows once learning runs (it prints a line every 100 steps),
   right after 4 on the same game. Run as published but for the edits gymnasium 1.x and ale-py 0.12 require
   (CLEANRL_EDITS, applied to a copy in a temporary directory).

Rates of 1-3 are the best of 3 rounds of at least a second; 4's and 5's windows are medians. The machine is
shared: compare ratios from one run.
"""
import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax
from bench_host import best_rate, host_run, log
from shared import REPO_ROOT, format_rate, print_machine, print_table

sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(REPO_ROOT / "tests"))
FRAMES_PER_STEP = 4
SECTIONS = ["engine", "actors", "system", "learner"]
COLUMNS = ["run", "stage", "env steps/s", "frames/s", "notes"]


def engine_rows(game: str, num_envs: int) -> tuple[list[list[str]], float]:
    """Section 1; returns its rows and the synchronous rate (env steps/s)."""
    from ale_py.vector_env import AtariVectorEnv

    from lightspeed.envs.atari_env import rom_id

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

    from lightspeed.framework.anakin.trainer import build
    from lightspeed.framework.core.config import validated

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


def actor_rows(game: str, num_envs: int, engine_rate: Optional[float]) -> list[list[str]]:
    """Section 2, in one thread and in two owning half the env columns each (the engine steps in C++ without the
    GIL, so one half steps while the other's policy runs)."""
    rows = []
    for threads in (1, 2):
        rate = actor_rate(game, num_envs, threads)
        rows.append(["", f"2. actors with their policy, {threads} thread{'s' * (threads > 1)}", format_rate(rate),
                     format_rate(FRAMES_PER_STEP * rate),
                     f"{rate / engine_rate:.0%} of the sync engine" if engine_rate else ""])
    return rows


def learner_rows(batch_sizes: tuple[int, ...] = (32, 512), updates: int = 4) -> list[list[str]]:
    """Section 3: Ape-X's Nature network updates in a scan, nn.Conv against StridedConv, interleaved rounds."""
    import flax.linen as nn

    from lightspeed.algorithms.common.networks import NATURE_LAYERS, StridedConv
    from lightspeed.algorithms.common.targets import huber, td_errors
    from lightspeed.algorithms.common.transition import Transition

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
        batch = Transition(obs=obs, action=jnp.zeros(batch_size, jnp.int32), n_step_return=jnp.ones(batch_size),
                           bootstrap_obs=obs, bootstrap_discount=jnp.full(batch_size, 0.99),
                           valid=jnp.ones(batch_size))
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
    from lightspeed.framework.sebulba.runtime import RuntimeStopped

    while True:
        try:
            reports.get(timeout=1.0, patient=False)
        except TimeoutError:
            continue
        except RuntimeStopped:
            return


def system_rates(game: str, algo: str, num_envs: int, window: float, windows: int) -> tuple[float, float, int]:
    """Section 4: a free-mode run's median env steps/s and learner batches/s over fixed windows once the learner
    has started, and its batch size."""
    from lightspeed.framework.sebulba.runtime import BoundedQueue, StopSignal
    from lightspeed.framework.sebulba.trainer import start_learner

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
        for mark in range(windows + 1):
            marks.append((time.perf_counter(), run.rounds_inserted * run.round_env_steps, run.learner_updates))
            if mark < windows:
                time.sleep(window)
        stop.raise_if_failed()
    finally:
        run.stop_requested = True
        stop.stop("the bench ended")
        learner.join(60)
        run.close()
    # (seconds, env steps, learner updates) at each mark -> each window's env steps/s and batches/s
    deltas = np.diff(np.array(marks, float), axis=0)
    return (float(np.median(deltas[:, 1] / deltas[:, 0])), float(np.median(deltas[:, 2] / deltas[:, 0])),
            train.algo.batch_size)


def system_row(algo: str, rates: tuple[float, float, int], window: float, windows: int) -> list[str]:
    """Section 4's row of one algorithm from its `system_rates`."""
    env_rate, batches, batch_size = rates
    label = "Ape-X, 0.8 samples per insert" if algo == "apex" else "DQN, 8 samples per insert"
    return ["", f"4. system, {label}", format_rate(env_rate), format_rate(FRAMES_PER_STEP * env_rate),
            f"{batches:.2f} batches/s of {batch_size}, median of {windows} x {window:.0f} s"]


# (what, published text, replacement): only what gymnasium 1.x and ale-py 0.12 require of dqn_atari_jax.py
CLEANRL_EDITS = [
    ("ALE's ids are registered by importing ale_py (gymnasium 1.0 stopped doing it)",
     "import gymnasium as gym\n", "import gymnasium as gym\nimport ale_py\n\ngym.register_envs(ale_py)\n"),
    ("the renamed wrappers", "gym.wrappers.GrayScaleObservation(env)", "gym.wrappers.GrayscaleObservation(env)"),
    ("", "gym.wrappers.FrameStack(env, 4)", "gym.wrappers.FrameStackObservation(env, 4)"),
    ("the autoreset the script was written for (gymnasium 1.x defaults to NEXT_STEP)",
     "for i in range(args.num_envs)]\n    )",
     "for i in range(args.num_envs)],\n        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,\n    )"),
    ("final_info is one dict of arrays with `_episode` masks, no longer a list of dicts",
     """            for info in infos["final_info"]:
                if info and "episode" in info:
                    print(f"global_step={global_step}, episodic_return={info['episode']['r']}")
                    writer.add_scalar("charts/episodic_return", info["episode"]["r"], global_step)
                    writer.add_scalar("charts/episodic_length", info["episode"]["l"], global_step)""",
     """            final = infos["final_info"]
            for index in np.flatnonzero(final.get("_episode", [])):
                print(f"global_step={global_step}, episodic_return={final['episode']['r'][index]}")
                writer.add_scalar("charts/episodic_return", final["episode"]["r"][index], global_step)
                writer.add_scalar("charts/episodic_length", final["episode"]["l"][index], global_step)"""),
    ("final_observation is final_obs", 'infos["final_observation"][idx]', 'infos["final_obs"][idx]'),
]


def edited_cleanrl(source: str) -> str:
    """dqn_atari_jax.py with CLEANRL_EDITS applied, each found exactly once (else CleanRL changed: say so)."""
    for why, published, replacement in CLEANRL_EDITS:
        if source.count(published) != 1:
            raise SystemExit(f"bench_atari: --cleanrl: dqn_atari_jax.py no longer contains {published!r} once "
                             f"({why or 'an edit'}); this bench's CLEANRL_EDITS need updating for this CleanRL.")
        source = source.replace(published, replacement)
    return source


def cleanrl_row(game: str, checkout: Path, window: float, windows: int) -> list[str]:
    """Section 5: CleanRL's DQN, its env steps counted from its once-per-100-steps SPS lines in fixed windows."""
    script = checkout / "cleanrl" / "dqn_atari_jax.py"
    if not script.is_file():
        raise SystemExit(f"bench_atari: --cleanrl {checkout}: no cleanrl/dqn_atari_jax.py there; pass a "
                         "checkout of https://github.com/vwxyzjn/cleanrl.")
    lines, started = [], threading.Event()
    with tempfile.TemporaryDirectory() as workdir:
        edited = Path(workdir) / "dqn_atari_jax.py"
        edited.write_text(edited_cleanrl(script.read_text()))
        command = [sys.executable, str(edited), "--env-id", f"{game}NoFrameskip-v4", "--total-timesteps", "20000",
                   "--learning-starts", "10000", "--buffer-size", "20000"]
        process = subprocess.Popen(command, cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                   env={**os.environ, "PYTHONPATH": str(checkout)})

        def read() -> None:  # each SPS line is 100 more env steps, printed once learning runs
            for line in process.stdout:
                if line.startswith("SPS:"):
                    lines.append(time.perf_counter())
                    started.set()
                else:
                    log(f"cleanrl: {line.rstrip()}"[:200])

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            while not started.wait(1.0):
                if process.poll() is not None:
                    raise SystemExit(f"bench_atari: CleanRL's dqn_atari_jax.py exited ({process.returncode}) before "
                                     "it learned; its output is above.")
            marks = np.array([time.perf_counter() + window * k for k in range(windows + 1)])
            while time.perf_counter() < marks[-1] and process.poll() is None:
                time.sleep(0.5)
            ended = time.perf_counter()  # windows that end after its 20k steps are not whole
        finally:
            process.kill()
            process.wait()
    whole = marks[marks <= ended]
    if len(whole) < 2:
        raise SystemExit(f"bench_atari: CleanRL's 20k steps ended within its first {window:.0f} s window of learning; "
                         "pass a shorter --window.")
    counts, _ = np.histogram(lines, bins=whole)
    env_rate = float(np.median(100 * counts / window))
    return ["", "5. CleanRL dqn_atari_jax.py, 8 samples per insert", format_rate(env_rate),
            format_rate(FRAMES_PER_STEP * env_rate),
            f"{env_rate / 4:.2f} batches/s of 32, median of {len(counts)} x {window:.0f} s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--games", nargs="+", default=["Pong", "Breakout"])
    parser.add_argument("--envs", type=int, default=32, help="envs of the engine and the actors (a multiple of 8)")
    parser.add_argument("--window", type=float, default=60.0)
    parser.add_argument("--windows", type=int, default=3)
    parser.add_argument("--sections", nargs="+", choices=SECTIONS, default=SECTIONS,
                        help="which of sections 1-4 to run (default: all; actors then show no ratio to the engine)")
    parser.add_argument("--cleanrl", type=Path, help="a checkout of github.com/vwxyzjn/cleanrl: section 5")
    args = parser.parse_args()

    print_machine("lightspeed on Atari (env=atari, ale-py)")
    rows = []
    for game in args.games:
        engine_rate = None
        if "engine" in args.sections:
            log(f"{game}: 1. engine")
            engine, engine_rate = engine_rows(game, args.envs)
            rows += engine
        if "actors" in args.sections:
            log(f"{game}: 2. actors")
            rows += actor_rows(game, args.envs, engine_rate)
        if "system" in args.sections:
            for algo in ("apex", "dqn"):
                log(f"{game}: 4. system, {algo}")
                rates = system_rates(game, algo, args.envs, args.window, args.windows)
                rows.append(system_row(algo, rates, args.window, args.windows))
        if args.cleanrl:
            log(f"{game}: 5. CleanRL")
            rows.append(cleanrl_row(game, args.cleanrl, args.window, args.windows))
    if "learner" in args.sections:
        log("3. learner")
        rows += learner_rows()
    print_table("Atari: env steps/s and frames/s over all envs (one actor thread), learner batches/s",
                COLUMNS, rows)


if __name__ == "__main__":
    main()
