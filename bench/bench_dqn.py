"""DQN on CartPole-v1: wall-clock from launch to solved, lightspeed next to stable-baselines3.

    python bench/bench_dqn.py [--sb3-seeds 3] [--skip-sb3]

lightspeed: `run.py algo=dqn env=cartpole num_seeds=10 target_return=475 total_env_steps=100000`
(conf/algo/dqn.yaml with conf/algo_env/dqn_cartpole.yaml), one process, ten seeds vmapped in one
program: cold (no compilation cache), then relaunched with a filled cache. stable-baselines3: its
DQN with the rl-zoo CartPole-v1 hyperparameters, one process per seed, evaluated greedily on 16
episodes every 5,000 steps. "Solved" = a greedy evaluation return >= 475; times count from
interpreter start (imports and compilation included). Needs the bench extra and stable-baselines3 with torch.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from shared import SOLVE_HEADER, format_value, print_table, run_to_solve, solve_rows

TARGET = 475.0

# rl-baselines3-zoo, hyperparams/dqn.yml, CartPole-v1
SB3_ZOO = dict(learning_rate=2.3e-3, batch_size=64, buffer_size=100_000, learning_starts=1000, gamma=0.99,
               target_update_interval=10, train_freq=256, gradient_steps=128, exploration_fraction=0.16,
               exploration_final_eps=0.04, policy_kwargs=dict(net_arch=[256, 256]))
SB3_STEPS = 50_000

SB3_CHILD = r'''
import time
START = time.time()
import json, sys
import gymnasium as gym
import numpy as np
from stable_baselines3 import DQN
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.evaluation import evaluate_policy

seed, steps, target, hyper = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), json.loads(sys.argv[4])

class SolveWatcher(BaseCallback):
    """Greedy evaluation every 5,000 steps; stops training once it reaches the target."""
    def __init__(self):
        super().__init__()
        self.eval_env = gym.make("CartPole-v1")
        self.solved_at = None
    def _on_step(self):
        if self.num_timesteps % 5000 == 0:
            mean, _ = evaluate_policy(self.model, self.eval_env, n_eval_episodes=16, deterministic=True)
            if mean >= target:
                self.solved_at = (self.num_timesteps, time.time() - START)
                return False
        return True

model = DQN("MlpPolicy", gym.make("CartPole-v1"), seed=seed, device="cpu", verbose=0, **hyper)
watcher = SolveWatcher()
model.learn(total_timesteps=steps, callback=watcher)
print(json.dumps({"solved_at_env_steps": watcher.solved_at and watcher.solved_at[0],
                  "solved_at_seconds": watcher.solved_at and watcher.solved_at[1],
                  "wall_seconds": time.time() - START}))
'''


def run_sb3(seed: int) -> dict:
    start = time.time()
    out = subprocess.run([sys.executable, "-c", SB3_CHILD, str(seed), str(SB3_STEPS), str(TARGET), json.dumps(SB3_ZOO)],
                         check=True, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "2"})
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result["process_seconds"] = time.time() - start
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10, help="lightspeed seeds, vmapped in one run")
    parser.add_argument("--sb3-seeds", type=int, default=3)
    parser.add_argument("--skip-sb3", action="store_true")
    args = parser.parse_args()

    print(f"DQN on CartPole-v1, solved = greedy evaluation return >= {TARGET:.0f}; seconds from launch\n")
    overrides = ("algo=dqn", "env=cartpole", f"num_seeds={args.seeds}", f"target_return={TARGET}",
                 "total_env_steps=100000")
    rows = solve_rows("lightspeed, cold (all seeds, one process)", run_to_solve(*overrides))
    # run.py keeps compiled programs on disk by default: a relaunch of the same shapes skips XLA's build
    with tempfile.TemporaryDirectory(prefix="bench_xla_cache_") as cache:
        run_to_solve(*overrides, compilation_cache=cache)
        relaunch = run_to_solve(*overrides, compilation_cache=cache)
        rows += solve_rows("lightspeed, relaunch with its compilation cache", relaunch)[:1]
    if not args.skip_sb3:
        for seed in range(args.sb3_seeds):
            result = run_sb3(seed)
            rows.append([f"stable-baselines3 rl-zoo, seed {seed}", "yes" if result["solved_at_env_steps"] else "no",
                         format_value(result["solved_at_env_steps"]), format_value(result["solved_at_seconds"], ".1f"),
                         f"{result['process_seconds']:.1f}", "-"])
    print_table("", SOLVE_HEADER, rows)

if __name__ == "__main__":
    main()
