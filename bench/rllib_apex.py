"""Reference: RLlib 2.8.1's Ape-X DQN on gymnasium CartPole-v1, timed on this machine.

    bash bench/rllib_venv.sh   # once: its own venv, /tmp/rllib-venv unless RLLIB_VENV says otherwise
    /tmp/rllib-venv/bin/python bench/rllib_apex.py [--workers 3] [--envs-per-worker 1] [--training-intensity 8]
        [--seconds 180] [--target 475] [--seed 0] [--eval-every-s 15] [--eval-episodes 10]

Starts a local Ray bound to loopback, builds ApexDQNConfig with RLlib's tuned CartPole Ape-X example
(rllib/tuned_examples/apex_dqn/cartpole-apex-dqn.yaml, also rllib_contrib/apex_dqn/tuned_examples/: 2 replay
shards of 20k in all, learning from 1k steps, target update every 500 trained steps, iterations of >= 5 s and
>= 1k sampled steps) with its training_intensity (trained / sampled agent steps, Reverb's samples per insert)
set from the command line, and calls algo.train() until --seconds of wall time have passed since the first
call. Every --eval-every-s seconds the driver plays --eval-episodes greedy episodes (explore=False) with the
learner's own policy on a CartPole-v1 of its own; the wall time (from the first train(), Ray start-up
excluded and reported apart) at which their mean first reaches --target is seconds_to_target. Rates use
train_seconds, the time spent inside train() calls (evaluation pauses excluded). Prints the whole config as
JSON, then one line `RESULT {json}`.
"""
import argparse
import json
import os
import sys
import time

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # nothing to report to: no internet here

import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402
import ray  # noqa: E402
from ray.rllib.algorithms.apex_dqn import ApexDQNConfig  # noqa: E402

REPLAY_SHARDS = 2  # the tuned example's optimizer.num_replay_buffer_shards


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=3, help="num_rollout_workers")
    parser.add_argument("--envs-per-worker", type=int, default=1)
    parser.add_argument("--training-intensity", type=float, default=8.0,
                        help="trained agent steps per sampled agent step (samples per insert)")
    parser.add_argument("--seconds", type=float, default=180.0, help="wall-clock budget of training")
    parser.add_argument("--target", type=float, default=475.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval-every-s", type=float, default=15.0, help="seconds between greedy evaluations")
    parser.add_argument("--eval-episodes", type=int, default=10)
    return parser.parse_args()


def make_config(args: argparse.Namespace) -> ApexDQNConfig:
    """The tuned CartPole Ape-X example (torch, CPU only); everything it does not name stays RLlib's default."""
    return (
        ApexDQNConfig()
        .environment("CartPole-v1")
        .framework("torch")
        .rollouts(num_rollout_workers=args.workers, num_envs_per_worker=args.envs_per_worker)
        .training(
            replay_buffer_config={"type": "MultiAgentPrioritizedReplayBuffer", "capacity": 20000},
            num_steps_sampled_before_learning_starts=1000,
            optimizer={"num_replay_buffer_shards": REPLAY_SHARDS},
            target_network_update_freq=500,
            training_intensity=args.training_intensity,
        )
        .resources(num_gpus=0)
        .reporting(min_sample_timesteps_per_iteration=1000, min_time_s_per_iteration=5)
        .debugging(seed=args.seed)
    )


def greedy_return(algo, env: gym.Env, episodes: int, seed: int) -> float:
    """Mean undiscounted return of `episodes` greedy episodes of the driver's (the learner's) policy."""
    returns = []
    for episode in range(episodes):
        obs, _ = env.reset(seed=seed + episode)
        done, total = False, 0.0
        while not done:
            action = algo.compute_single_action(obs, explore=False)
            obs, reward, terminated, truncated, _ = env.step(action)
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    return float(np.mean(returns))


def train(algo, args: argparse.Namespace) -> dict:
    """train() until the budget is spent, evaluating greedily every --eval-every-s seconds of wall time."""
    env = gym.make("CartPole-v1")
    eval_seed = 10_000 + 1_000 * args.seed  # episodes the learner's workers never see
    start = time.perf_counter()
    train_seconds, next_eval, seconds_to_target, result = 0.0, args.eval_every_s, None, {}
    while time.perf_counter() - start < args.seconds:
        t0 = time.perf_counter()
        result = algo.train()
        train_seconds += time.perf_counter() - t0
        wall = time.perf_counter() - start
        if seconds_to_target is None and wall >= next_eval:
            next_eval = wall + args.eval_every_s
            mean = greedy_return(algo, env, args.eval_episodes, eval_seed)
            print(f"[{wall:6.1f}s] env steps {result['num_env_steps_sampled']}, greedy mean {mean:.1f}", flush=True)
            if mean >= args.target:
                seconds_to_target = wall
    final = greedy_return(algo, env, args.eval_episodes, eval_seed + 500)
    return {"result": result, "train_seconds": train_seconds, "wall_seconds": time.perf_counter() - start,
            "seconds_to_target": seconds_to_target, "final_greedy_return": final}


def summarise(args: argparse.Namespace, config: ApexDQNConfig, run: dict, startup_seconds: float) -> dict:
    result, seconds = run["result"], run["train_seconds"]
    sampled, trained = result["num_agent_steps_sampled"], result["num_agent_steps_trained"]
    return {
        "rllib_version": ray.__version__,
        "workers": args.workers,
        "envs_per_worker": args.envs_per_worker,
        "training_intensity_set": args.training_intensity,
        "training_intensity_measured": round(trained / max(sampled, 1), 3),
        "env_steps_sampled": result["num_env_steps_sampled"],
        "env_steps_per_second": round(result["num_env_steps_sampled"] / seconds, 1),
        "learner_batches_per_second": round(trained / config.train_batch_size / seconds, 2),
        "train_batch_size": config.train_batch_size,
        "seconds_to_target": None if run["seconds_to_target"] is None else round(run["seconds_to_target"], 1),
        "final_greedy_return": run["final_greedy_return"],
        "startup_seconds": round(startup_seconds, 1),
        "train_seconds": round(seconds, 1),
        "wall_seconds": round(run["wall_seconds"], 1),  # train_seconds plus the greedy evaluations
    }


def main() -> int:
    args = parse_args()
    t0 = time.perf_counter()
    # a Ray of its own (address="local": never join a cluster another job left running on this machine), with
    # one CPU slot per rollout worker plus the driver's local worker and its replay shards (Ape-X's request)
    ray.init(address="local", num_cpus=args.workers + 1 + REPLAY_SHARDS, include_dashboard=False,
             _node_ip_address="127.0.0.1", logging_level="WARNING")
    try:
        config = make_config(args)
        algo = config.build()
        startup_seconds = time.perf_counter() - t0
        run = train(algo, args)
        algo.stop()
    finally:
        ray.shutdown()
    print(json.dumps(config.to_dict(), sort_keys=True, default=str, indent=1))
    print("RESULT " + json.dumps(summarise(args, config, run, startup_seconds)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
