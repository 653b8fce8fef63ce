"""What the bench scripts share: tables, rates, and a timed `run.py` launch."""
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

REPO_ROOT = Path(__file__).resolve().parent.parent


def format_rate(rate: Optional[float]) -> str:
    if rate is None:
        return "-"
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if rate >= scale:
            return f"{rate / scale:,.2f}{unit}"
    return f"{rate:,.0f}"


def format_value(value, spec: str = ",.0f", missing: str = "not solved") -> str:
    return missing if value is None else format(value, spec)


def print_table(title: str, header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """First column left-aligned, the others right-aligned, widths from the contents."""
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        first = str(cells[0]).ljust(widths[0])
        rest = [str(cell).rjust(width) for cell, width in zip(cells[1:], widths[1:], strict=True)]
        return "  ".join([first, *rest])

    print(f"\n{title}")
    print(line(header))
    print("  ".join("-" * width for width in widths))
    for row in rows:
        print(line(row))
    sys.stdout.flush()


def run_to_solve(*overrides: str, compilation_cache: Optional[str] = None, keep_dir: bool = False) -> dict:
    """`python run.py OVERRIDES`: its summary and process seconds (and its run dir, with `keep_dir`).
    Without `compilation_cache` a cold start, whose compilation counts as it does for the references."""
    run_dir = Path(tempfile.mkdtemp(prefix="bench_run_"))
    args = [sys.executable, str(REPO_ROOT / "run.py"), *overrides, "progress=false", f"hydra.run.dir={run_dir}",
            f"compilation_cache={compilation_cache or 'null'}"]
    start = time.time()
    subprocess.run(args, cwd=REPO_ROOT, check=True, capture_output=True)
    wall = time.time() - start
    result = {"summary": json.loads((run_dir / "summary.json").read_text()), "process_seconds": wall,
              "run_dir": run_dir}
    if not keep_dir:
        shutil.rmtree(run_dir, ignore_errors=True)
    return result


def first_crossing(run_dir: Path, target: float, every_seed: bool = False) -> Optional[float]:
    """perf/wall_seconds (from launch) of the first periodic evaluation whose mean over seeds, or with `every_seed`
    whose lowest seed, is at or above target. A first crossing, not a result: the final evaluation is."""
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        returns = record.get("eval/return_per_seed" if every_seed else "eval/return")
        if returns is not None and np.min(returns) >= target:
            return record["perf/wall_seconds"]
    return None


def curve_history(run_dir: Path, target: float, window: int = 3):
    """A run's periodic evaluations (metrics.jsonl) replayed through the trainer's protocol for `target`."""
    sys.path.insert(0, str(REPO_ROOT))
    from lightspeed.framework.run.protocol import EvaluationHistory

    evaluations = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evaluations = [e for e in evaluations if "eval/return_per_seed" in e]
    history = EvaluationHistory(len(evaluations[0]["eval/return_per_seed"]), target, window)
    for e in evaluations:
        history.record(e["env_steps"], np.array(e["eval/return_per_seed"], dtype=float), e["perf/wall_seconds"])
    return history


def curve_stability(history) -> Optional[float]:
    """The history's stability pooled over its seeds, as framework.tools.report pools summary.json's."""
    sys.path.insert(0, str(REPO_ROOT))
    from lightspeed.framework.tools.report import pooled_stability

    later = [history.after_first_hit(seed) for seed in range(len(history.solved_at_env_steps))]
    seeds = [{"stability": history.stability(seed), "evaluations_after_target": None if after is None else len(after)}
             for seed, after in enumerate(later)]
    return pooled_stability(seeds)


def final_iqm(finals: Sequence[float]) -> str:
    """IQM [95% CI] of final returns, with rliable as framework.tools.report computes it."""
    sys.path.insert(0, str(REPO_ROOT))
    from lightspeed.framework.tools.report import iqm_interval

    estimate, low, high = iqm_interval(np.asarray(finals, dtype=float))
    return f"{float(estimate):.1f} [{float(low):.1f}, {float(high):.1f}]"


def protocol_rows(label: str, overrides: Sequence[str], target: float) -> tuple[list[list[str]], dict]:
    """One configuration under the protocol: launch to every seed sustained-solved (cold, then
    relaunched with a filled compilation cache), and the default-length run's final evaluation."""
    solve = (*overrides, f"target_return={target}")
    cold = run_to_solve(*solve)
    with tempfile.TemporaryDirectory(prefix="bench_xla_cache_") as cache:
        run_to_solve(*solve, compilation_cache=cache)
        relaunch = run_to_solve(*solve, compilation_cache=cache)
        full = run_to_solve(*overrides, compilation_cache=cache, keep_dir=True)
    history = curve_history(full["run_dir"], target)
    finals = [seed["final_eval_return"] for seed in full["summary"]["seeds"]]

    def all_solved_seconds(result: dict) -> Optional[float]:
        seeds = result["summary"]["seeds"]
        times = [seed["solved_at_seconds"] for seed in seeds]
        return None if None in times else max(times)

    stability = curve_stability(history)
    numbers = {"cold": all_solved_seconds(cold), "relaunch": all_solved_seconds(relaunch), "finals": finals,
               "stability": stability, "full_seconds": full["process_seconds"]}
    solved_steps = [seed["solved_at_env_steps"] for seed in cold["summary"]["seeds"]]
    row = [label, f"{sum(s is not None for s in solved_steps)}/{len(solved_steps)}",
           format_value(max((s for s in solved_steps if s is not None), default=None)),
           format_value(numbers["cold"], ".1f"), format_value(numbers["relaunch"], ".1f"),
           f"{cold['summary']['compile_seconds']:.1f}", final_iqm(finals), f"{min(finals):.0f}",
           f"{sum(f >= target for f in finals)}/{len(finals)}", format_value(stability, ".2f", "-"),
           f"{full['summary']['env_steps']:,}", f"{full['process_seconds']:.1f}"]
    return [row], numbers


PROTOCOL_HEADER = ["run", "sustained-solved", "env steps to solve (max)", "launch to all solved, cold [s]",
                   "relaunch, cached [s]", "compile [s]", "final IQM [95% CI]", "final min", "finals >= target",
                   "stability", "run length [env steps]", "full run [s]"]


# rl-baselines3-zoo, hyperparams/dqn.yml (master, ce95481): each env's tuned DQN and its n_timesteps
SB3_ZOO = {
    "CartPole-v1": (50_000, dict(learning_rate=2.3e-3, batch_size=64, buffer_size=100_000, learning_starts=1000,
                                 gamma=0.99, target_update_interval=10, train_freq=256, gradient_steps=128,
                                 exploration_fraction=0.16, exploration_final_eps=0.04,
                                 policy_kwargs=dict(net_arch=[256, 256]))),
    "Acrobot-v1": (100_000, dict(learning_rate=6.3e-4, batch_size=128, buffer_size=50_000, learning_starts=0,
                                 gamma=0.99, target_update_interval=250, train_freq=4, gradient_steps=-1,
                                 exploration_fraction=0.12, exploration_final_eps=0.1,
                                 policy_kwargs=dict(net_arch=[256, 256]))),
    "MountainCar-v0": (120_000, dict(learning_rate=4e-3, batch_size=128, buffer_size=10_000, learning_starts=1000,
                                     gamma=0.98, target_update_interval=600, train_freq=16, gradient_steps=8,
                                     exploration_fraction=0.2, exploration_final_eps=0.07,
                                     policy_kwargs=dict(net_arch=[256, 256]))),
}

# rl-baselines3-zoo, hyperparams/td3.yml and sac.yml (as the zoo's published Pendulum-v1 models record them)
SB3_ZOO_CONTINUOUS = {
    "TD3": {"Pendulum-v1": (20_000, dict(learning_rate=1e-3, buffer_size=200_000, learning_starts=10_000, gamma=0.98,
                                         train_freq=(1, "episode"), gradient_steps=-1,
                                         policy_kwargs=dict(net_arch=[400, 300])))},
    "SAC": {"Pendulum-v1": (20_000, dict(learning_rate=1e-3))},
}
# the zoo's MuJoCo entries (td3.yml and sac.yml, "mujoco-defaults", 1e6 steps): SB3's defaults (TD3 400x300 nets,
# SAC 256x256, batches of 256, one gradient step per env step) after 10,000 random steps
MUJOCO_ZOO = (1_000_000, dict(learning_starts=10_000))
for zoo in SB3_ZOO_CONTINUOUS.values():  # TD3's and SAC's
    zoo.update(dict.fromkeys(("HalfCheetah-v5", "Hopper-v5"), MUJOCO_ZOO))
SB3_NOISE_STD = {"TD3": 0.1}  # the zoo's noise_type normal, noise_std 0.1

# rl-baselines3-zoo, hyperparams/ppo.yml (master, 00128b5): its tuned PPO per env (n_envs and normalize are the zoo's
# vectorisation and VecNormalize; "lin_X" anneals X to 0). HalfCheetah: the zoo's tuned HalfCheetah-v3 entry on v5.
HALFCHEETAH_PPO_ZOO = dict(normalize=True, n_envs=1, batch_size=64, n_steps=512, gamma=0.98, learning_rate=2.0633e-05,
                           ent_coef=0.000401762, clip_range=0.1, n_epochs=20, gae_lambda=0.92, max_grad_norm=0.8,
                           vf_coef=0.58096, policy_kwargs=dict(log_std_init=-2, ortho_init=False, activation_fn="ReLU",
                                                               net_arch=dict(pi=[256, 256], vf=[256, 256])))
SB3_ZOO_PPO = {
    "CartPole-v1": (100_000, dict(n_envs=8, n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98, n_epochs=20,
                                  ent_coef=0.0, learning_rate="lin_0.001", clip_range="lin_0.2")),
    "Pendulum-v1": (100_000, dict(n_envs=4, n_steps=1024, gae_lambda=0.95, gamma=0.9, n_epochs=10, ent_coef=0.0,
                                  learning_rate=1e-3, clip_range=0.2, use_sde=True, sde_sample_freq=4)),
    "HalfCheetah-v5": (1_000_000, HALFCHEETAH_PPO_ZOO),
}

SB3_CHILD = r'''
import time
START = time.time()
import json, sys
import gymnasium as gym
import numpy as np
import stable_baselines3
import torch.nn
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.noise import NormalActionNoise
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.vec_env import VecNormalize

spec = json.loads(sys.argv[1])
env_id, target, eval_every = spec["env_id"], spec["target"], spec["eval_every"]
max_seconds = spec.get("max_seconds")
n_envs, normalize = spec.get("n_envs", 1), spec.get("normalize", False)

def zoo_value(value):
    # rl-zoo's "lin_X": X annealed linearly to 0 over the run (SB3 calls a schedule with the progress left, 1 -> 0)
    if isinstance(value, str) and value.startswith("lin_"):
        start = float(value[4:])
        return lambda progress_remaining: progress_remaining * start
    return value

def evaluation_env():
    # normalised observations as the model saw them in training (the statistics synced before each evaluation)
    if not normalize:
        return gym.make(env_id)
    return VecNormalize(make_vec_env(env_id, n_envs=1), training=False, norm_reward=False)

def evaluate(model, env, episodes):
    if normalize:
        env.obs_rms = model.get_env().obs_rms.copy()
    mean, _ = evaluate_policy(model, env, n_eval_episodes=episodes, deterministic=True)
    return float(mean)

class Evaluations(BaseCallback):
    """Greedy evaluation of 16 episodes every `eval_every` steps, as lightspeed's periodic ones; trains on to
    the end."""
    def __init__(self):
        super().__init__()
        self.eval_env = evaluation_env()
        self.returns, self.first_solve = [], None
    def _on_step(self):
        if max_seconds and time.time() - START > max_seconds:
            return False  # the wall-clock budget is spent: stop training, evaluate what was learned
        if eval_every and self.num_timesteps % eval_every < n_envs:
            mean = evaluate(self.model, self.eval_env, 16)
            self.returns.append(mean)
            if target is not None and mean >= target and self.first_solve is None:
                self.first_solve = (self.num_timesteps, time.time() - START)
        return True

hyper = {key: zoo_value(value) for key, value in spec["hyper"].items()}
if isinstance(hyper.get("train_freq"), list):
    hyper["train_freq"] = tuple(hyper["train_freq"])
if isinstance(hyper.get("policy_kwargs", {}).get("activation_fn"), str):
    policy_kwargs = hyper["policy_kwargs"]
    hyper["policy_kwargs"] = dict(policy_kwargs, activation_fn=getattr(torch.nn, policy_kwargs["activation_fn"]))
if n_envs > 1 or normalize:
    env = make_vec_env(env_id, n_envs=n_envs, seed=spec["seed"])
    env = VecNormalize(env, gamma=hyper.get("gamma", 0.99)) if normalize else env
else:
    env = gym.make(env_id)
if spec.get("noise_std"):
    size = env.action_space.shape[0]
    hyper["action_noise"] = NormalActionNoise(np.zeros(size), spec["noise_std"] * np.ones(size))
model = getattr(stable_baselines3, spec.get("algo", "DQN"))("MlpPolicy", env, seed=spec["seed"], device="cpu",
                                                            verbose=0, **hyper)
evaluations = Evaluations()
model.learn(total_timesteps=spec["steps"], callback=evaluations)
final = evaluate(model, evaluation_env(), 100)
print(json.dumps({"first_solve_env_steps": evaluations.first_solve and evaluations.first_solve[0],
                  "first_solve_seconds": evaluations.first_solve and evaluations.first_solve[1],
                  "final_eval_return": final, "returns": evaluations.returns,
                  "env_steps": int(model.num_timesteps), "wall_seconds": time.time() - START}))
'''


def run_sb3(env_id: str, seed: int, target: Optional[float] = None, eval_every: int = 5000, algo: str = "DQN",
            max_seconds: Optional[float] = None, env_steps: Optional[int] = None) -> dict:
    """stable-baselines3's `algo` (DQN, PPO, TD3, SAC) with rl-zoo's settings for `env_id`, for rl-zoo's n_timesteps
    or `env_steps` (training stops early once `max_seconds` from launch are spent), in a fresh process with
    OMP_NUM_THREADS torch threads (2 unless set): its periodic evaluations (none if `eval_every` is 0), its final
    100-episode greedy (deterministic) return, the env steps it trained and its wall-clock. Needs
    stable-baselines3 (with torch)."""
    zoo = {"DQN": SB3_ZOO, "PPO": SB3_ZOO_PPO}.get(algo) or SB3_ZOO_CONTINUOUS[algo]
    zoo_steps, hyper = zoo[env_id]
    hyper = dict(hyper)
    vectorised = dict(n_envs=hyper.pop("n_envs", 1), normalize=hyper.pop("normalize", False))
    spec = dict(env_id=env_id, seed=seed, steps=env_steps or zoo_steps, target=target, eval_every=eval_every,
                hyper=hyper, algo=algo, noise_std=SB3_NOISE_STD.get(algo), max_seconds=max_seconds, **vectorised)
    out = subprocess.run([sys.executable, "-c", SB3_CHILD, json.dumps(spec)], check=True, capture_output=True,
                         text=True, env={"OMP_NUM_THREADS": "2", **os.environ})
    return json.loads(out.stdout.strip().splitlines()[-1])


def sb3_rows(num_seeds: int, target: float) -> tuple[list[list[str]], list[dict]]:
    """One row per SB3 seed under the same protocol: its first solve, its final 100-episode greedy return."""
    rows, results = [], []
    for seed in range(num_seeds):
        result = run_sb3("CartPole-v1", seed, target)
        returns = np.array(result["returns"])
        hits = np.flatnonzero(returns >= target)
        stability = (float(np.mean(returns[hits[0] + 1:] >= target))
                     if len(hits) and hits[0] + 1 < len(returns) else None)
        results.append({**result, "stability": stability})
        rows.append([f"stable-baselines3 rl-zoo DQN, seed {seed}", "-",
                     format_value(result["first_solve_env_steps"], ",.0f", "never"),
                     format_value(result["first_solve_seconds"], ".1f", "never") + " (first solve)", "-", "-",
                     f"{result['final_eval_return']:.1f}", f"{result['final_eval_return']:.0f}",
                     f"{int(result['final_eval_return'] >= target)}/1", format_value(stability, ".2f", "-"),
                     f"{result['env_steps']:,}", f"{result['wall_seconds']:.1f}"])
    return rows, results


def median_first_solve(results: Sequence[dict]) -> Optional[float]:
    times = [r["first_solve_seconds"] for r in results]
    return None if not times or None in times else float(np.median(times))


def print_protocol_table(title: str, configurations: dict[str, Sequence[str]], target: float,
                         sb3_seeds: int) -> dict[str, dict]:
    """Every configuration under the protocol, then `sb3_seeds` stable-baselines3 seeds, in one table;
    each configuration's numbers, and the SB3 median first solve (under "sb3")."""
    rows, numbers = [], {}
    for label, overrides in configurations.items():
        table, numbers[label] = protocol_rows(label, overrides, target)
        rows += table
    sb3_table, sb3 = sb3_rows(sb3_seeds, target) if sb3_seeds else ([], [])
    print_table(title, PROTOCOL_HEADER, rows + sb3_table)
    for label, values in numbers.items():
        solved = (f"every seed sustained-solved {values['cold']:.1f} s from a cold launch" if values["cold"] is not None
                  else "not every seed sustained-solved within the run")
        print(f"   {label}: {solved}")
    if sb3:
        numbers["sb3"] = {"median_first_solve": median_first_solve(sb3)}
        print(f"   the median stable-baselines3 seed first solved at "
              f"{format_value(numbers['sb3']['median_first_solve'], '.1f', 'never')} s from its launch")
    return numbers


def cpu_model() -> str:
    try:
        for text_line in Path("/proc/cpuinfo").read_text().splitlines():
            if text_line.startswith("model name"):
                return text_line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def print_machine(title: str, open_devices: bool = True) -> None:
    """The header every table starts with. A script whose runs are child processes passes open_devices=False: an
    accelerator that one process at a time may hold (a TPU) must be left to them, so the header names only JAX's
    version and the platforms the runs are asked for."""
    import jax

    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(title)
    print(f"  date:    {datetime.datetime.now().astimezone().strftime('%Y-%m-%d %H:%M %Z')}")
    print(f"  cpu:     {cpu_model()}")
    print(f"  cores:   {os.cpu_count()} ({usable} usable by this process)")
    if open_devices:
        print(f"  jax:     {jax.__version__} on {jax.default_backend()}, {len(jax.devices())} device(s)")
    else:
        platforms = os.environ.get("JAX_PLATFORMS") or "JAX's default"
        print(f"  jax:     {jax.__version__}; the runs, child processes, on {platforms} (summary.json: num_devices)")
    print(f"  python:  {platform.python_version()}")
    sys.stdout.flush()
