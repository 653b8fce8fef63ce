"""Where the time of a host-env run goes (env=gymnasium): env, actor, learner, system, JAX path.

    python bench/bench_host.py [--algos dqn apex r2d2 d4pg] [--seeds 10] [--env-steps 20000] [--diagnose] [--profile]
                               [--side] [--whole] [--skip-sb3]

Each algorithm on its task (TASKS): DQN and Ape-X on CartPole-v1, R2D2 on CartPole without its velocities
(lightspeed.envs.partially_observed:CartPolePosition-v1; the JAX path env=cartpole env.observe=position), D4PG on
Pendulum-v1
(the JAX path gymnax's).

For each algorithm with its defaults (algo=dqn picks conf/algo_env/dqn_gymnasium.yaml), in this process:

1. env alone: the actor thread's HostVectorEnv (every seed's envs, one batch) stepped with random actions.
2. env with policy: `Actor.block` in a loop with the parameters fixed (`run.store.latest()`), no learner:
   the actor loop as training runs it (one jitted call per vector step), its blocks waited for.
3. learner solo: blocks from 2 inserted past `learning_starts`, then `learn_round` in a loop, the learner
   state waited for after every round: learner batches/s (rounds x updates_per_learn, per seed as
   `runtime/learner_batches_per_second` counts them) and sampled items/s (all seeds).
4. the whole system in training: a fresh HostRun (same compiled programs) running `run_free` on its learner
   thread, as `train_host` starts it, this thread draining its reports (no evaluation); timed from the
   start to the learner thread's end. Its rates next to 2 and 3, the runtime's wait fractions, and the CPU
   it got. The bounds row: 2 and 3 taking turns (no overlap), and overlapped (the slower of the two).
   --diagnose adds 4b: the same with each parameter copy published only once it is computed (a bench-side
   patch of the run's store): JAX dispatches the learner's round asynchronously, so in 4 an actor's next
   call waits for the unfinished round, and that wait is counted as the actor's busy time.
5. the JAX single program on the same algorithm, seeds and steps: `run.py env=cartpole ...`, summary.json's
   env_steps_per_second (after compilation).

The CPU bound: what 4 can reach when each side needs the cores it used alone in 2 and 3 (cores / (2's cores per
env step + 3's cores per env step at the samples per insert)). --whole adds 6: whole default runs, `run.py
env=gymnasium` and `env=cartpole`, wall-clock from launch (evaluations included), and one stable-baselines3 seed
(rl-zoo's DQN, bench/shared.py; --skip-sb3 leaves it out).

Rates of 1-3 are the best of 3 rounds of at least a second each; 4 is one run, so its ratios to 2 and 3
are conservative. The machine is shared: compare ratios from one run, not absolute rates across runs.

--side adds two side experiments: gymnasium's env checker (`disable_env_checker=True` against the default,
80 CartPole envs in a SyncVectorEnv, random actions, interleaved rounds) and XLA's intra-op threads (1-4 in
child processes with and without XLA_FLAGS=--xla_cpu_multi_thread_eigen=false, and 5 likewise). --profile
prints cProfile's top functions of the actor loop (2). The default run takes about 5 minutes on 2 cores.
"""
import argparse
import cProfile
import io
import json
import os
import pstats
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple, Optional

import numpy as np
from shared import REPO_ROOT, format_rate, print_machine, print_table, run_to_solve

ROUNDS, ROUND_SECONDS = 3, 1.0
ACCEPT_ENV, ACCEPT_LEARNER = 0.65, 0.50  # the acceptance: system / env with policy, learner / solo
NO_EIGEN_THREADS = "--xla_cpu_multi_thread_eigen=false"
# TrainConfig.compilation_cache, what a plain `python run.py` uses (expanded: Hydra's grammar has no `~`)
DEFAULT_CACHE = str(Path("~/.cache/lightspeed/xla").expanduser())


def best_rate(work, units_per_call: float, rounds: int = ROUNDS, seconds: float = ROUND_SECONDS) -> float:
    """Units per second of `work()` (which waits for its own results), the best of `rounds` rounds."""
    best = 0.0
    for _ in range(rounds):
        calls, start = 0, time.perf_counter()
        while True:
            work()
            calls += 1
            elapsed = time.perf_counter() - start
            if elapsed >= seconds:
                break
        best = max(best, calls * units_per_call / elapsed)
    return best


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def host_run(train, env, algorithm):
    """A HostRun with its actors started (HostRun creates them itself in earlier versions)."""
    from lightspeed.framework.sebulba.trainer import HostRun

    run = HostRun(train, env, algorithm)
    if not run.actors and hasattr(run, "start_actors"):
        run.start_actors()
    return run


def share_programs() -> None:
    """Every HostRun of this process gets the first one's jitted programs, so a second run compiles nothing.
    (A bench-side patch of framework.sebulba.trainer's module global; the framework's code is unchanged.)"""
    from lightspeed.framework.sebulba import trainer as host_trainer

    if getattr(host_trainer.host_programs, "shared", False):
        return
    original, made = host_trainer.host_programs, {}

    def shared(algorithm, columns):
        key = (id(algorithm), columns.tobytes())
        if key not in made:
            made[key] = (algorithm, original(algorithm, columns))  # the algorithm kept alive: its id stays its own
        return made[key][1]

    shared.shared = True
    host_trainer.host_programs = shared


def thread_timed(block, total: list):
    """`Actor.block` adding the calling thread's CPU seconds to total[0]."""
    def timed(*args, **kwargs):
        start = time.thread_time()
        try:
            return block(*args, **kwargs)
        finally:
            total[0] += time.thread_time() - start

    return timed


def measure(algo: str, seeds: int, env_steps: int, profile: bool = False, diagnose: bool = False) -> dict:
    """Sections 1-4 for one algorithm, in this process."""
    import jax
    import numpy as np

    sys.path.insert(0, str(REPO_ROOT))
    sys.path.insert(0, str(REPO_ROOT / "tests"))
    from conftest import compose_config

    from lightspeed.framework.anakin.trainer import build
    from lightspeed.framework.core.config import validated

    share_programs()
    train = validated(compose_config(f"algo={algo}", *TASKS[algo].host, f"num_seeds={seeds}",
                                     f"total_env_steps={env_steps}"))
    env, _, algorithm = build(train)
    run = host_run(train, env, algorithm)
    parts, actor = run.parts, run.actors[0]
    per_block = seeds * run.round_env_steps  # env steps of one block (all seeds; one actor thread)
    out = {"algo": algo, "seeds": seeds, "envs_per_seed": parts.num_envs, "block_steps": parts.block_steps,
           "updates_per_learn": parts.updates_per_learn, "samples_per_learn": parts.samples_per_learn,
           "samples_per_insert": run.spi, "actor_threads": len(run.actors),
           # the limiter counts items: transitions (one per env step) or R2D2's sequences (one per period)
           "steps_per_item": run.round_env_steps / parts.block_items}
    try:
        # 1. env alone
        envs, rng = actor.envs, np.random.default_rng(0)
        log(f"{algo}: 1. env alone ({envs.num_envs} envs)")
        space = env.action_space()
        out["env"] = best_rate(lambda: envs.step(random_actions(space, rng, envs.num_envs)), envs.num_envs)

        # 2. env with policy, parameters fixed
        log(f"{algo}: 2. env with policy")
        fixed = run.store.latest()
        blocks, counter = [], [0]

        def act() -> None:
            block = actor.block(counter[0] * run.round_env_steps, lambda: fixed, lambda: fixed[1])
            jax.block_until_ready(block)
            counter[0] += 1
            blocks.append(block)
            del blocks[:-64]

        act()  # compiles the actor's programs
        out["policy"] = best_rate(act, per_block)
        wall, thread_cpu, cpu = time.perf_counter(), time.thread_time(), time.process_time()
        for _ in range(5):
            act()
        wall = time.perf_counter() - wall
        out["policy_actor_cpu"] = (time.thread_time() - thread_cpu) / wall
        out["policy_process_cores"] = (time.process_time() - cpu) / wall
        if profile:
            profiler = cProfile.Profile()
            profiler.enable()
            for _ in range(20):
                act()
            profiler.disable()
            text = io.StringIO()
            pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(14)
            out["profile"] = text.getvalue()

        # 3. learner solo, past learning_starts
        log(f"{algo}: 3. learner solo")
        needed = -(-parts.learning_starts // parts.block_items)
        while len(blocks) < needed:
            act()
        for block in blocks[-needed:]:
            run.insert([block])

        def learn() -> None:
            run.learn_round()
            jax.block_until_ready(run.learner)

        learn()  # compiles the learner's round
        out["learner"] = best_rate(learn, parts.updates_per_learn)
        returned, ready, cpu = [], [], time.process_time()
        for _ in range(5):
            start = time.perf_counter()
            run.learn_round()
            returned.append(time.perf_counter() - start)
            jax.block_until_ready(run.learner)
            ready.append(time.perf_counter() - start)
        out["learn_returned_ms"], out["learn_ready_ms"] = 1e3 * np.median(returned), 1e3 * np.median(ready)
        out["learner_process_cores"] = (time.process_time() - cpu) / sum(ready)
        out["sampled"] = out["learner"] / parts.updates_per_learn * parts.samples_per_learn * seeds
    finally:
        run.close()

    # 4. the whole system, free mode, its reports drained here (no evaluation)
    log(f"{algo}: 4. the system ({seeds} x {env_steps:,} env steps)")
    out.update(system(train, env, algorithm))
    if diagnose:
        log(f"{algo}: 4b. the system, parameters computed before they are published")
        out["ready"] = system(train, env, algorithm, ready_publish=True)
    return out


def random_actions(space, rng, count: int):
    """`count` uniform actions of a Discrete or a (bounded) Box space."""
    if space.kind == "discrete":
        return rng.integers(space.start, space.start + space.n, count)
    return rng.uniform(space.low, space.high, (count, *space.shape)).astype(space.dtype)


def system(train, env, algorithm, ready_publish: bool = False) -> dict:
    """Section 4: a fresh HostRun trained in free mode, timed from the learner thread's start to its end.
    `ready_publish`: the store publishes a parameter copy only once it is computed (a bench-side patch of the
    run's store; the framework publishes JAX's asynchronously dispatched result as it is)."""
    import jax

    from lightspeed.framework.sebulba.runtime import BoundedQueue, StopSignal
    from lightspeed.framework.sebulba.trainer import start_learner

    reports, stop = BoundedQueue(4), StopSignal()
    run = host_run(train, env, algorithm)
    if ready_publish:
        publish = run.store.publish
        run.store.publish = lambda params, version: publish(jax.block_until_ready(params), version)
    actor_cpu = [0.0]
    for actor in run.actors:
        actor.block = thread_timed(actor.block, actor_cpu)
    try:
        start, cpu = time.perf_counter(), time.process_time()
        learner = start_learner(run, reports, stop)
        while True:
            stop.raise_if_failed()
            try:
                report = reports.get(timeout=1.0, patient=False)
            except TimeoutError:
                if not learner.is_alive():
                    break
                continue
            jax.block_until_ready(report.params)
            if report.last:
                break
        learner.join()
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
        stop.raise_if_failed()
        metrics = run.runtime_metrics(seconds)
        env_steps = train.num_seeds * run.rounds_inserted * run.round_env_steps
        return dict(system_env=env_steps / seconds, system_learner=run.learner_updates / seconds,
                    system_seconds=seconds, system_env_steps=env_steps,
                    actor_wait=metrics["runtime/actor_wait_fraction"],
                    learner_wait=metrics["runtime/learner_wait_fraction"],
                    staleness=metrics["runtime/staleness"], measured_spi=metrics["runtime/samples_per_insert"],
                    process_cores=cpu / seconds,
                    actor_cpu=actor_cpu[0] / max(sum(actor.meter.busy for actor in run.actors), 1e-9))
    finally:
        stop.stop("the bench ended")
        run.close()


def jax_path(algo: str, seeds: int, env_steps: int, xla_flags: str = "") -> float:
    """The single program's env steps/s (all seeds, after compilation) from summary.json."""
    run_dir = Path(tempfile.mkdtemp(prefix="bench_host_"))
    try:
        subprocess.run([sys.executable, str(REPO_ROOT / "run.py"), f"algo={algo}", *TASKS[algo].jax,
                        f"num_seeds={seeds}", f"total_env_steps={env_steps}", f"eval_every={env_steps}",
                        f"log_every={env_steps}", "final_eval_episodes=10", "progress=false",
                        f"hydra.run.dir={run_dir}"], cwd=REPO_ROOT, check=True, capture_output=True,
                       env=with_xla_flags(xla_flags))
        return float(json.loads((run_dir / "summary.json").read_text())["env_steps_per_second"])
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def whole_run_rows(algos: list[str], seeds: int, sb3: bool) -> list[list[str]]:
    """Section 6: whole runs of each algorithm on the host path and the JAX path, and one stable-baselines3 seed."""
    rows = []
    for algo in algos:
        for env in ("gymnasium", "cartpole"):
            log(f"{algo}: 6. a whole run, env={env}")
            # run.py as a user runs it: defaults, its compilation cache, timed from launch to exit
            r = run_to_solve(f"algo={algo}", f"env={env}", f"num_seeds={seeds}", compilation_cache=DEFAULT_CACHE)
            finals = [seed["final_eval_return"] for seed in r["summary"]["seeds"]]
            solved = sum(final >= 475 for final in finals)
            rows.append([f"lightspeed {algo}, env={env}", str(seeds), f"{r['summary']['env_steps']:,}",
                         f"{r['process_seconds']:.1f}", f"{min(finals):.1f}", f"{solved}/{seeds}"])
    if sb3:
        from shared import SB3_ZOO, run_sb3

        log("6. stable-baselines3, one seed")
        r = run_sb3("CartPole-v1", 0)
        rows.append(["stable-baselines3 rl-zoo DQN", "1", f"{SB3_ZOO['CartPole-v1'][0]:,}", f"{r['wall_seconds']:.1f}",
                     f"{r['final_eval_return']:.1f}", f"{int(r['final_eval_return'] >= 475)}/1"])
    return rows


# MinAtar paper (Young & Tian 2019), DQN at 5M frames (bench_envs.py's, read off its learning-curve figure); the
# gymnax path's committed Ape-X finals (README, bench_envs.py --skip-classic: env=minatar, 2M frames, seed=0)
MINATAR_GAMES = {"Breakout": (10.0, "17.8, 23.3"), "SpaceInvaders": (43.0, "82.8, 76.5"),
                 "Asterix": (17.0, "9.5, 23.0"), "Freeway": (50.0, "64.0, 64.1")}


def minatar_rows(games: list[str], seeds: int, frames: int, seed: int, gymnax: bool, out: Optional[Path]
                 ) -> list[list[str]]:
    """The MinAtar suite: host Ape-X on MinAtar's own package (`env=gymnasium env.id=MinAtar/<Game>-v1`, its sticky
    actions 0.1, algo_env=apex_minatar's settings), `seeds` seeds vmapped in one run per game; with `gymnax`, the
    gymnax path (env=minatar) rerun on the same seeds. Each game's results go to `out` as they end."""
    rows = []
    for game in games:
        paper, committed = MINATAR_GAMES[game]
        runs = {"host": ("env=gymnasium", f"env.id=MinAtar/{game}-v1")}
        if gymnax:
            runs["gymnax"] = ("env=minatar", f"env.id={game}-MinAtar")
        finals = {}
        for path, env_overrides in runs.items():
            log(f"minatar: {game}, {path} path")
            r = run_to_solve("algo=apex", *env_overrides, "algo_env=apex_minatar", f"num_seeds={seeds}",
                             f"seed={seed}", f"total_env_steps={frames}", compilation_cache=DEFAULT_CACHE)
            summary = r["summary"]
            finals[path] = [s["final_eval_return"] for s in summary["seeds"]]
            if out is not None:
                (out / f"{game}_{path}.json").write_text(json.dumps({"summary": summary, "wall": r["process_seconds"]}))
            if path == "host":
                runtime = summary["runtime"]
                host = [f"{np.mean(finals[path]):.1f}", " ".join(f"{f:.1f}" for f in finals[path]),
                        f"{summary['env_steps_per_second']:,.0f}",
                        f"{runtime['runtime/learner_batches_per_second']:,.0f}", f"{r['process_seconds']:.0f}"]
        gymnax_finals = ", ".join(f"{f:.1f}" for f in finals["gymnax"]) + " (rerun)" if gymnax else committed
        rows.append([game, f"{frames:,} x {seeds}", *host[:2], f"~{paper:g}",
                     "yes" if np.mean(finals["host"]) >= paper else "no", gymnax_finals, *host[2:]])
    return rows


def with_xla_flags(extra: str) -> dict:
    return {**os.environ, "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} {extra}".strip()}


class Task(NamedTuple):
    name: str
    host: tuple[str, ...]  # run.py overrides of the host path
    jax: tuple[str, ...]  # and of the single program on the same task


CARTPOLE = Task("CartPole-v1", ("env=gymnasium",), ("env=cartpole",))
TASKS = {"dqn": CARTPOLE, "apex": CARTPOLE,
         "r2d2": Task("CartPole without velocities",
                      ("env=gymnasium", "env.id=lightspeed.envs.partially_observed:CartPolePosition-v1"),
                      ("env=cartpole", "env.observe=position")),
         "d4pg": Task("Pendulum-v1", ("env=gymnasium", "env.id=Pendulum-v1"), ("env=gymnax", "env.id=Pendulum-v1"))}


def ratio(a: float, b: float) -> str:
    return f"{a / b:.0%}" if b else "-"


def system_rows(r: dict, s: dict, label: str, cpu_bound: float) -> list[list[str]]:
    """Rows of one system run `s` of the algorithm measured in `r`."""
    limit = s["system_env"] / r["seeds"] / r["steps_per_item"] * r["samples_per_insert"] * r["updates_per_learn"] / r[
        "samples_per_learn"] if r["samples_per_insert"] else None
    return [
        ["", f"{label} ({s['system_seconds']:.0f} s)", format_rate(s["system_env"]), f"{s['system_learner']:,.0f}",
         f"env {ratio(s['system_env'], r['policy'])} of 2 (>= {ACCEPT_ENV:.0%}), learner "
         f"{ratio(s['system_learner'], r['learner'])} of 3 (>= {ACCEPT_LEARNER:.0%}); env "
         f"{ratio(s['system_env'], cpu_bound)} of the CPU bound"],
        ["", "   waits, limiter", "", "",
         f"actor waits {s['actor_wait']:.0%}, learner waits {s['learner_wait']:.0%}; samples/insert "
         f"{s['measured_spi']:.2f} (target {r['samples_per_insert']}), which allows "
         + (f"{limit:,.0f} batches/s at this env rate" if limit else "any rate")],
        ["", "   CPU", "", "",
         f"process {s['process_cores']:.2f} cores; actor thread on CPU {s['actor_cpu']:.0%} of its busy time; "
         f"staleness {s['staleness']:.1f} versions"],
    ]


def print_where(results: list[dict]) -> None:
    rows = []
    for r in results:
        # the env steps/s (all seeds) the learner alone keeps up with at its samples per insert
        learner_env = (r["learner"] / r["updates_per_learn"] * r["samples_per_learn"] / r["samples_per_insert"]
                       * r["steps_per_item"] * r["seeds"]) if r["samples_per_insert"] else float("inf")
        serial = 1 / (1 / r["policy"] + 1 / learner_env)
        # what both sides together can reach when each needs the cores it used alone
        cpu_bound = os.cpu_count() / (r["policy_process_cores"] / r["policy"]
                                      + r["learner_process_cores"] / learner_env)
        rows += [
            [f"{r['algo']}, {r['seeds']} seeds x {r['envs_per_seed']} envs, {TASKS[r['algo']].name}",
             "1. env alone (random actions)",
             format_rate(r["env"]), "", ""],
            ["", "2. env with policy (Actor.block, fixed params)", format_rate(r["policy"]), "",
             f"{ratio(r['policy'], r['env'])} of 1; process {r['policy_process_cores']:.2f} cores, actor thread on "
             f"CPU {r['policy_actor_cpu']:.0%}"],
            ["", "3. learner solo (learn_round)", "", f"{r['learner']:,.0f}",
             f"{format_rate(r['sampled'])} items/s; a round returns in {r['learn_returned_ms']:.1f} ms, is ready in "
             f"{r['learn_ready_ms']:.0f} ms; process {r['learner_process_cores']:.2f} cores"],
            ["", "   bounds from 2 and 3", format_rate(serial), "", f"in turn (no overlap): 1 / (1/2 + 1/learner's env "
             f"rate {format_rate(learner_env)}); overlapped: {format_rate(min(r['policy'], learner_env))}"],
            ["", "   CPU bound", format_rate(cpu_bound), "",
             f"{os.cpu_count()} cores / (2's core-s per env step + 3's per env step at its ratio): "
             f"{os.cpu_count()} / ({r['policy_process_cores']:.2f}/{format_rate(r['policy'])} + "
             f"{r['learner_process_cores']:.2f}/{format_rate(learner_env)}); 65% of 2 is "
             f"{format_rate(ACCEPT_ENV * r['policy'])}"],
            *system_rows(r, r, "4. system, free mode", cpu_bound),
            *(system_rows(r, r["ready"], "4b. system, publish once computed", cpu_bound) if "ready" in r else []),
            ["", f"5. JAX single program ({' '.join(TASKS[r['algo']].jax)})", format_rate(r["jax"]), "",
             f"host system (4) = {r['system_env'] / r['jax']:.1%} of it"],
        ]
    print_table("Where the time goes: env=gymnasium, one actor thread, each algorithm's defaults on its task "
                "(env steps/s over all seeds; learner batches/s per seed, the seeds in one vmapped call)",
                ["run", "stage", "env steps/s", "learner batches/s", "notes"], rows)


def env_checker_experiment(num_envs: int = 80, rounds: int = 5) -> list[list[str]]:
    """SyncVectorEnv of `num_envs` CartPole-v1 with and without gymnasium's env checker; interleaved rounds."""
    import gymnasium
    import numpy as np
    from gymnasium.vector import AutoresetMode, SyncVectorEnv

    variants = {"gymnasium.make default (env checker on)": {},
                "gymnasium.make(disable_env_checker=True)": {"disable_env_checker": True}}
    vectors = {name: SyncVectorEnv([lambda kw=kw: gymnasium.make("CartPole-v1", **kw) for _ in range(num_envs)],
                                   autoreset_mode=AutoresetMode.SAME_STEP) for name, kw in variants.items()}
    rng, best = np.random.default_rng(0), dict.fromkeys(vectors, 0.0)
    for vector in vectors.values():
        vector.reset(seed=0)
    for _ in range(rounds):
        for name, vector in vectors.items():
            best[name] = max(best[name], best_rate(lambda v=vector: v.step(rng.integers(0, 2, num_envs)),
                                                   num_envs, rounds=1, seconds=0.5))
    for vector in vectors.values():
        vector.close()
    base = best["gymnasium.make default (env checker on)"]
    return [[name, format_rate(rate), ratio(rate, base)] for name, rate in best.items()]


def child_measure(algo: str, seeds: int, env_steps: int, xla_flags: str) -> dict:
    child = subprocess.run([sys.executable, __file__, "--worker", algo, "--seeds", str(seeds), "--env-steps",
                            str(env_steps)], cwd=REPO_ROOT, check=True, capture_output=True, text=True,
                           env=with_xla_flags(xla_flags))
    return json.loads(child.stdout.strip().splitlines()[-1])


def xla_threads_experiment(algo: str, seeds: int, env_steps: int) -> list[list[str]]:
    """Sections 1-4 (and 5) in child processes with and without XLA's multi-threaded Eigen."""
    rows = []
    for label, flags in (("default", ""), (NO_EIGEN_THREADS, NO_EIGEN_THREADS)):
        log(f"side: XLA flags {label!r}, {algo}")
        r = child_measure(algo, seeds, env_steps, flags)
        r["jax"] = jax_path(algo, seeds, env_steps, flags)
        rows.append([f"{algo}, XLA {label}", format_rate(r["env"]), format_rate(r["policy"]), f"{r['learner']:,.0f}",
                     format_rate(r["system_env"]), f"{r['system_learner']:,.0f}", format_rate(r["jax"])])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algos", nargs="+", default=["dqn", "apex"], choices=list(TASKS))
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--env-steps", type=int, default=20_000, help="env steps per seed of 4 and 5")
    parser.add_argument("--side", action="store_true", help="the env checker and XLA threads experiments")
    parser.add_argument("--profile", action="store_true", help="cProfile of the actor loop")
    parser.add_argument("--diagnose", action="store_true",
                        help="4b: the system again, each parameter copy published once it is computed")
    parser.add_argument("--whole", action="store_true",
                        help="6: whole default runs, host and JAX path, wall-clock from launch, and one SB3 seed")
    parser.add_argument("--skip-sb3", action="store_true", help="6 without stable-baselines3")
    parser.add_argument("--minatar", action="store_true",
                        help="the MinAtar suite instead (host Ape-X on MinAtar's own package; ~1 h on 2 cores)")
    parser.add_argument("--minatar-games", nargs="+", default=list(MINATAR_GAMES), choices=list(MINATAR_GAMES))
    parser.add_argument("--minatar-seeds", type=int, default=3)
    parser.add_argument("--minatar-frames", type=int, default=2_000_000)
    parser.add_argument("--minatar-seed", type=int, default=0, help="seed base (apex_minatar was tuned at 100)")
    parser.add_argument("--minatar-gymnax", action="store_true", help="rerun the gymnax path on the same seeds")
    parser.add_argument("--minatar-out", type=Path, help="a folder for each game's summary as it ends")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(measure(args.worker, args.seeds, args.env_steps)), flush=True)
        return
    if args.minatar:
        print_machine("lightspeed host-env benchmark: MinAtar's own package (env=gymnasium)")
        start = time.time()
        if args.minatar_out:
            args.minatar_out.mkdir(parents=True, exist_ok=True)
        rows = minatar_rows(args.minatar_games, args.minatar_seeds, args.minatar_frames, args.minatar_seed,
                            args.minatar_gymnax, args.minatar_out)
        print_table(f"MinAtar through its own package (MinAtar/<Game>-v1: sticky actions 0.1, minimal action set, "
                    f"1000-step cap, Freeway 2500), host Ape-X (algo_env=apex_minatar), seed={args.minatar_seed}, "
                    "final 100-episode greedy return",
                    ["game", "frames", "mean final", "final per seed", "paper DQN (5M frames)", "mean >= paper",
                     "gymnax path Ape-X (env=minatar)", "frames/s (all seeds)", "learner batches/s", "wall [s]"],
                    rows)
        print(f"\nbenchmark wall-clock {time.time() - start:.0f} s")
        return

    print_machine("lightspeed host-env benchmark (env=gymnasium)")
    print(f"  load:    {os.getloadavg()[0]:.1f} (1-min load average at the start; the machine is shared)")
    results = []
    for algo in args.algos:
        result = measure(algo, args.seeds, args.env_steps, profile=args.profile, diagnose=args.diagnose)
        log(f"{algo}: 5. the JAX single program")
        result["jax"] = jax_path(algo, args.seeds, args.env_steps)
        results.append(result)
    print_where(results)
    if args.whole:
        print_table("Whole runs from launch (defaults; periodic evaluations and the final one included)",
                    ["run", "seeds", "env steps per seed", "wall s", "min final", "finals >= 475"],
                    whole_run_rows([a for a in args.algos if TASKS[a] is CARTPOLE], args.seeds,
                                   not args.skip_sb3))
    print(f"  load:    {os.getloadavg()[0]:.1f} (1-min load average at the end)")
    for r in results:
        if "profile" in r:
            print(f"\ncProfile of the actor loop (2), {r['algo']}, 20 blocks, by own time:")
            print("\n".join(line for line in r["profile"].splitlines()[:40] if line.strip()))
    if args.side:
        log("side: env checker")
        print_table("Side: 80 CartPole-v1 envs in a SyncVectorEnv, random actions (best of 5 interleaved rounds)",
                    ["env", "env steps/s", "ratio"], env_checker_experiment())
        print_table(f"Side: XLA intra-op threads ({NO_EIGEN_THREADS}), 1-5 in child processes",
                    ["run", "1. env", "2. env + policy", "3. learner", "4. system env", "4. system learner",
                     "5. JAX"], [row for algo in args.algos for row in xla_threads_experiment(algo, args.seeds,
                                                                                             args.env_steps)])


if __name__ == "__main__":
    main()
