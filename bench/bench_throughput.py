"""Throughput and memory benchmarks: `python bench/bench_throughput.py [--quick] [--skip-memory | --memory]`.

1. Tabular Q-learning agent-steps/s on the default gridworld, driven the way the trainer drives
   it (the trainer's seed-parallel init and run_chunk programs), next to a baseline
   written in the style of the seed article (per-agent keys split every step, `lax.cond`
   explore/exploit, `jax.random.choice` tie-breaks, a `fori_loop` that writes the whole Q-table
   into a [steps + 1, H, W, A] history every step, vmapped over agents).
2. CartPole env-steps/s under random actions, ours vs gymnax's CartPole-v1, same scan driver.
3. Peak resident memory and wall time of `run.py` training 30 tabular agents for 10M steps each.

Timings are the best of several interleaved rounds (A, B, A, B, ...): the machine is shared and
noisy, so compare the ratios printed by one run rather than absolute numbers across runs.
"""
import argparse
import importlib.metadata
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from shared import REPO_ROOT, format_rate, print_machine, print_table

GRID_AGENTS = (1, 30, 1024, 8192)
CARTPOLE_ENVS = (1, 64, 1024, 16384)
TARGET_CALL_SECONDS = 0.4  # each timed call of a compiled program lasts about this long
REFERENCE_HISTORY_BUDGET = 400 * 2**20  # bytes of Q-table history the seed-article baseline may hold
REFERENCE_MIN_STEPS = 200  # fewer steps than this would measure allocation, not learning
REFERENCE_MAX_STEPS = 20_000
MEMORY_TARGET_KIB = 10**9 / 1024  # 1 GB (10^9 bytes), stricter than 1 GiB


# ----------------------------------------------------------------------------- timing helpers

class Workload:
    """A compiled program that advances its own carried state; `steps_per_call` env steps per call."""

    def __init__(self, name: str, call: Callable[[Any], Any], state: Any, steps_per_call: int, length: int):
        self.name, self._call, self._state = name, call, state
        self.steps_per_call = steps_per_call
        self.length = length  # the loop length compiled into the program (K updates, T steps, ...)
        self.best_seconds = float("inf")

    def __call__(self) -> None:
        import jax

        self._state = jax.block_until_ready(self._call(self._state))

    def time_round(self, min_seconds: float) -> float:
        """Call repeatedly for at least `min_seconds`; record and return the seconds per call."""
        calls, start = 0, time.perf_counter()
        while True:
            self()
            calls += 1
            elapsed = time.perf_counter() - start
            if elapsed >= min_seconds:
                break
        per_call = elapsed / calls
        self.best_seconds = min(self.best_seconds, per_call)
        return per_call

    @property
    def best_rate(self) -> float:
        return self.steps_per_call / self.best_seconds


def seconds_per_call(workload: Workload) -> float:
    """Warm up once, then time one call."""
    workload()
    start = time.perf_counter()
    workload()
    return time.perf_counter() - start


def calibrated(build: Callable[[int], Workload], probe_length: int, attempts: int = 4) -> Workload:
    """Rebuild with a scaled loop length until one call lasts TARGET_CALL_SECONDS within a factor 2."""
    length = probe_length
    for _ in range(attempts):
        workload = build(length)
        seconds = seconds_per_call(workload)  # includes the warm-up call
        if 0.5 <= seconds / TARGET_CALL_SECONDS <= 2:
            break
        scale = min(64.0, max(1 / 64, TARGET_CALL_SECONDS / max(seconds, 1e-6)))
        length = max(1, round(length * scale))
    return workload


def interleaved_best(workloads: Sequence[Workload], rounds: int, round_seconds: float) -> None:
    """A, B, A, B, ...: every workload sees the same machine load; each keeps its best round."""
    for _ in range(rounds):
        for workload in workloads:
            workload.time_round(round_seconds)


# ----------------------------------------------------------------------------- formatting

def progress(message: str) -> None:
    """Progress goes to stderr, so `> results.txt` keeps only the tables."""
    print(f"[bench] {message}: done", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- 1. tabular Q

def tabular_q_workload(num_agents: int, num_updates: int) -> Workload:
    """Our tabular Q, driven exactly as framework.anakin.trainer.train_single_program drives it (one seed)."""
    import jax

    from lightspeed import envs
    from lightspeed.algorithms.tabular_q import TabularQConfig, make_tabular_q
    from lightspeed.framework.anakin.trainer import seed_parallel_programs
    from lightspeed.framework.core.devices import make_mesh
    from lightspeed.framework.core.evaluation import make_evaluate

    env, env_params = envs.make("gridworld")
    algo = make_tabular_q(TabularQConfig(num_agents=num_agents), env, env_params)
    num_seeds = 1
    evaluate = make_evaluate(env, env_params, algo, num_episodes=1)
    programs = seed_parallel_programs(algo, evaluate, make_mesh(num_seeds, False, None), num_updates)
    state = programs.init(jax.random.split(jax.random.key(0), num_seeds))
    run = programs.run_chunk.lower(state).compile()
    # the state is donated and threaded through every call; the metrics come back each time
    call = lambda carry: run(carry[0])
    steps = num_seeds * num_updates * algo.env_steps_per_update
    return Workload("lightspeed", call, (state, None), steps, num_updates)


def seed_article_rollout(num_agents: int, steps: int, height: int, width: int, start: Sequence[int],
                         goal: Sequence[int], epsilon: float = 0.1, learning_rate: float = 0.1,
                         discount: float = 0.9) -> Callable:
    """Baseline in the seed article's style: returns jit(vmap(single_agent_rollout)) over agent keys."""
    import jax
    import jax.numpy as jnp
    from jax import lax, random

    num_actions = 4
    movements = jnp.array([[0, 1], [1, 0], [0, -1], [-1, 0]])  # right, down, left, up
    grid_max = jnp.array([height - 1, width - 1])
    initial_state, goal_state = jnp.array(start), jnp.array(goal)

    def policy(key, state, q_values):
        key, subkey = random.split(key)
        explore = random.uniform(subkey) < epsilon
        key, subkey = random.split(key)

        def random_action(k):
            return random.choice(k, jnp.arange(num_actions))

        def greedy_action(k):  # uniform among the maximal actions
            q = q_values[state[0], state[1]]
            is_max = q == q.max()
            return random.choice(k, jnp.arange(num_actions), p=is_max / is_max.sum())

        return lax.cond(explore, random_action, greedy_action, subkey), key

    def env_step(env_state, action):
        state, key = env_state
        state = jnp.clip(state + movements[action], 0, grid_max)
        done = jnp.all(state == goal_state)
        reward = done.astype(jnp.float32)
        obs = state
        env_state = lax.cond(done, reset, lambda es: es, (state, key))  # _reset_if_done
        return env_state, obs, reward, done

    def reset(env_state):
        _, key = env_state
        key, _ = random.split(key)
        return initial_state, key

    def q_update(q_values, state, action, reward, done, next_state):
        target = reward + discount * (1 - done) * q_values[next_state[0], next_state[1]].max()
        old = q_values[state[0], state[1], action]
        return q_values.at[state[0], state[1], action].set(old + learning_rate * (target - old))

    def single_agent_rollout(key):
        env_key, action_key = random.split(key)
        all_obs = jnp.zeros((steps, 2), jnp.int32)
        all_rewards = jnp.zeros(steps, jnp.float32)
        all_done = jnp.zeros(steps, jnp.bool_)
        all_q_values = jnp.zeros((steps + 1, height, width, num_actions), jnp.float32)

        def fori_body(i, val):
            env_state, action_key, all_obs, all_rewards, all_done, all_q_values = val
            state, _ = env_state
            q_values = all_q_values[i]
            action, action_key = policy(action_key, state, q_values)
            env_state, obs, reward, done = env_step(env_state, action)
            q_values = q_update(q_values, state, action, reward, done, obs)
            all_obs = all_obs.at[i].set(obs)
            all_rewards = all_rewards.at[i].set(reward)
            all_done = all_done.at[i].set(done)
            all_q_values = all_q_values.at[i + 1].set(q_values)
            return env_state, action_key, all_obs, all_rewards, all_done, all_q_values

        val = ((initial_state, env_key), action_key, all_obs, all_rewards, all_done, all_q_values)
        _, _, all_obs, all_rewards, all_done, all_q_values = lax.fori_loop(0, steps, fori_body, val)
        return all_obs, all_rewards, all_done, all_q_values

    return jax.jit(jax.vmap(single_agent_rollout))


def reference_steps(num_agents: int, height: int, width: int, num_actions: int = 4) -> int:
    """Steps per agent that keep the baseline's Q-table history within its memory budget (0: skip)."""
    table_bytes = num_agents * height * width * num_actions * 4  # float32 tables of all agents
    steps = min(REFERENCE_MAX_STEPS, REFERENCE_HISTORY_BUDGET // table_bytes - 1)  # history holds steps + 1
    return steps if steps >= REFERENCE_MIN_STEPS else 0


def reference_workload(num_agents: int, steps: int) -> tuple[Workload, int]:
    """The seed-article-style baseline; returns it and the bytes its compiled program holds."""
    import jax

    from lightspeed import envs

    env, params = envs.make("gridworld")
    height, width = env.grid_shape
    rollout = seed_article_rollout(num_agents, steps, height, width,
                                   [int(v) for v in params.start], [int(v) for v in params.goal])
    keys = jax.random.split(jax.random.key(0), num_agents)
    compiled = rollout.lower(keys).compile()
    memory = compiled.memory_analysis()
    held = (memory.output_size_in_bytes + memory.temp_size_in_bytes) if memory is not None else 0

    def call(keys):
        # the whole history is an output, so nothing can be dropped; wait for it, then let it go
        # (holding it across calls would double the memory)
        jax.block_until_ready(compiled(keys))
        return keys

    return Workload("seed-article", call, keys, num_agents * steps, steps), held


def bench_tabular_q(rounds: int, round_seconds: float) -> None:
    from lightspeed import envs

    height, width = envs.make("gridworld")[0].grid_shape
    rows = []
    for num_agents in GRID_AGENTS:
        ours = calibrated(lambda k, num_agents=num_agents: tabular_q_workload(num_agents, k),
                          probe_length=max(1, 2**11 // num_agents))
        workloads, ref_cell, mem_cell = [ours], "skipped (memory)", "-"
        steps = reference_steps(num_agents, height, width)
        if steps:
            reference, held = reference_workload(num_agents, steps)
            reference()  # warm-up
            workloads.append(reference)
            mem_cell = f"{held / 2**20:,.0f}"
        interleaved_best(workloads, rounds, round_seconds)
        speedup = "-"
        if steps:
            ref_cell = format_rate(reference.best_rate)
            speedup = f"{ours.best_rate / reference.best_rate:,.1f}x"
        rows.append([f"{num_agents:,}", f"{ours.length:,}", format_rate(ours.best_rate), ref_cell,
                     f"{steps:,}" if steps else "-", mem_cell, speedup])
        progress(f"gridworld, {num_agents} agents")
    print_table(
        "1. Tabular Q-learning, default gridworld (8x12), agent-steps/s, one seed, best of "
        f"{rounds} interleaved rounds",
        ["agents", "K updates/call", "lightspeed", "seed-article style", "ref steps/call", "ref MB", "speedup"],
        rows)
    print("   lightspeed: the trainer's seed-parallel init and run_chunk(K updates) programs, as train() runs them")
    print("   seed-article style: per-agent keys split every step, lax.cond explore/exploit, random.choice ties,")
    print("   fori_loop writing the full Q-table into a [steps+1, H, W, A] history each step, vmapped over agents;")
    print("   'ref MB' = output + temporaries of that compiled program (the history dominates).")


# ----------------------------------------------------------------------------- 2. CartPole

def random_action_rollout(env: Any, params: Any, num_envs: int, length: int) -> Callable:
    """jit(scan) of `length` random-action vmapped steps; obs, rewards and done flags feed the carry."""
    import jax
    import jax.numpy as jnp

    step_all = jax.vmap(env.step, in_axes=(0, 0, 0, None))

    def body(carry, _):
        key, env_state, obs_sum, reward_sum, dones = carry
        key, step_key, action_key = jax.random.split(key, 3)
        actions = jax.random.randint(action_key, (num_envs,), 0, 2)
        obs, env_state, reward, terminated, truncated, _ = step_all(
            jax.random.split(step_key, num_envs), env_state, actions, params)
        done = jnp.logical_or(terminated, truncated)
        return (key, env_state, obs_sum + obs.sum(), reward_sum + reward.sum(), dones + done.sum()), None

    def rollout(carry):
        return jax.lax.scan(body, carry, length=length)[0]

    return jax.jit(rollout, donate_argnums=0)


def cartpole_workload(name: str, env: Any, params: Any, num_envs: int, length: int) -> Workload:
    import jax
    import jax.numpy as jnp

    key, reset_key = jax.random.split(jax.random.key(1))
    _, env_state = jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(reset_key, num_envs), params)
    carry = (key, env_state, jnp.float32(0), jnp.float32(0), jnp.int32(0))
    rollout = random_action_rollout(env, params, num_envs, length)
    compiled = rollout.lower(carry).compile()
    return Workload(name, compiled, carry, num_envs * length, length)


def check_gymnax_step(env: Any, params: Any) -> None:
    """gymnax 1.0.1's `step` returns six values; an older five-value gymnax would break the driver."""
    import jax

    _, state = env.reset(jax.random.key(0), params)
    result = env.step(jax.random.key(1), state, 0, params)
    if len(result) != 6:
        raise RuntimeError(f"gymnax step returned {len(result)} values, the bench expects 6 (gymnax >= 1.0)")


def bench_cartpole(rounds: int, round_seconds: float) -> None:
    from lightspeed import envs

    try:
        import gymnax
        gymnax_version = importlib.metadata.version("gymnax")
    except ImportError:
        print("\n2. CartPole: skipped, gymnax is not installed (pip install 'lightspeed[bench]')")
        return
    ours_env, ours_params = envs.make("cartpole")
    gymnax_env, gymnax_params = gymnax.make("CartPole-v1")
    check_gymnax_step(gymnax_env, gymnax_params)
    rows = []
    for num_envs in CARTPOLE_ENVS:
        probe = max(8, 2**18 // num_envs)
        ours = calibrated(lambda t, n=num_envs: cartpole_workload("lightspeed", ours_env, ours_params, n, t), probe)
        theirs = calibrated(lambda t, n=num_envs: cartpole_workload("gymnax", gymnax_env, gymnax_params, n, t), probe)
        interleaved_best([ours, theirs], rounds, round_seconds)
        rows.append([f"{num_envs:,}", f"{ours.length:,}", format_rate(ours.best_rate),
                     format_rate(theirs.best_rate), f"{ours.best_rate / theirs.best_rate:.2f}x"])
        progress(f"cartpole, {num_envs} envs")
    print_table(
        f"2. CartPole, random actions, env-steps/s, best of {rounds} interleaved rounds",
        ["envs", "T steps/call", "lightspeed", f"gymnax {gymnax_version}", "ours/gymnax"], rows)
    print("   both: jit(scan(T)) whose body splits the key, splits one key per env, draws random actions,")
    print("   calls vmap(env.step) (auto-reset) and sums obs, rewards and done flags into the carry.")


# ----------------------------------------------------------------------------- 3. memory

def memory_command(run_dir: str) -> list[str]:
    return [sys.executable, "run.py", "algo=tabular_q", "env=gridworld", "algo.num_agents=30",
            "total_env_steps=300000000", "eval_every=30000000", "log_every=30000000", "progress=false",
            f"hydra.run.dir={run_dir}"]


# Runs in a small intermediate process: a child spawned straight from this (large) benchmark
# process would inherit our own memory high-water mark in its ru_maxrss (vfork + exec).
MEASURE_CHILD = """
import json, resource, subprocess, sys, time
start = time.perf_counter()
returncode = subprocess.run(sys.argv[2:]).returncode
wall = time.perf_counter() - start
peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
json.dump({"returncode": returncode, "wall": wall, "peak_kib": peak_kib}, open(sys.argv[1], "w"))
"""


def measure_child(command: Sequence[str]) -> tuple[dict, str]:
    """Run `command` under MEASURE_CHILD: ({returncode, wall, peak_kib}, its stderr)."""
    with tempfile.TemporaryDirectory(prefix="lightspeed-bench-") as scratch:
        report = Path(scratch) / "measurement.json"
        result = subprocess.run([sys.executable, "-c", MEASURE_CHILD, str(report), *command],
                                cwd=REPO_ROOT, capture_output=True, text=True)
        if not report.exists():
            return {"returncode": result.returncode, "wall": float("nan"), "peak_kib": 0}, result.stderr
        return json.loads(report.read_text()), result.stderr


def bench_memory() -> None:
    """Peak RSS and wall time of a 30-agent x 10M-step training run in a child process."""
    with tempfile.TemporaryDirectory(prefix="lightspeed-bench-run-") as run_dir:
        command = memory_command(run_dir)
        measured, stderr = measure_child(command)
    returncode, peak_kib = measured["returncode"], measured["peak_kib"]
    status = "ok" if returncode == 0 else f"FAILED (exit {returncode})"
    verdict = "yes" if returncode == 0 and peak_kib < MEMORY_TARGET_KIB else "no"
    print_table(
        "3. Memory: tabular Q, 30 agents x 10M steps each (300M agent-steps), one run.py process",
        ["run", "peak RSS", "target", "within", "wall", "status"],
        [["run.py", f"{peak_kib / 1024:,.0f} MiB", "< 1 GB", verdict, f"{measured['wall']:,.1f} s", status]])
    print("   command: " + " ".join(command[1:-1]) + " hydra.run.dir=<tmp>")
    print("   peak RSS: getrusage(RUSAGE_CHILDREN).ru_maxrss, read in a small intermediate process")
    if returncode != 0:
        print("   child stderr (tail):")
        for text_line in stderr.strip().splitlines()[-15:]:
            print("     " + text_line)


# ----------------------------------------------------------------------------- main

def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer, shorter timing rounds (noisier)")
    memory = parser.add_mutually_exclusive_group()
    memory.add_argument("--skip-memory", action="store_true", help="skip the ~1 min run.py memory check")
    memory.add_argument("--memory", action="store_true", help="run only the memory check")
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> None:
    args = parse_args(argv)
    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))
    rounds, round_seconds = (2, 0.4) if args.quick else (5, 1.0)
    print_machine("lightspeed throughput benchmark")
    if not args.memory:
        bench_tabular_q(rounds, round_seconds)
        bench_cartpole(rounds, round_seconds)
    if not args.skip_memory:
        bench_memory()


if __name__ == "__main__":
    main()
