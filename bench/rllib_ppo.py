"""Reference: RLlib's PPO (new API stack: RLModule/Learner, EnvRunners, ConnectorV2) on gymnasium CartPole-v1.

    bash bench/rllib_ppo_venv.sh   # once: its own venv, /tmp/rllib-ppo-venv unless RLLIB_PPO_VENV says otherwise
    /tmp/rllib-ppo-venv/bin/python bench/rllib_ppo.py [--env-runners 2] [--seed 0] [--env-steps 500000]
        [--target 475] [--max-seconds S] [--eval-every 25000] [--eval-episodes 16] [--final-episodes 100]

Settings: RLlib's tuned CartPole PPO, rllib/examples/algorithms/ppo/cartpole_ppo.py in ray's repository (formerly
rllib/tuned_examples/ppo/cartpole_ppo.py; the wheel ships neither): lr 3e-4, num_epochs 6, vf_loss_coeff 0.01,
one hidden layer of 32 linear units with the value function sharing it; everything else is PPOConfig's default
(train_batch_size_per_learner 4000, minibatch_size 128, gamma 0.99, lambda 1.0, clip 0.3, KL loss on, ...), with
--env-runners EnvRunners of one env each and the local (num_learners=0) Learner on CPU.

Starts a Ray of its own bound to loopback and calls algo.train() until --env-steps env steps have been sampled or
--max-seconds have passed since launch. After each iteration it records the env steps sampled
(num_env_steps_sampled_lifetime), the wall time since launch and RLlib's sampled-episode return mean. Every
--eval-every env steps the driver plays --eval-episodes greedy (argmax) episodes with the Learner's own RLModule in
a plain gymnasium loop; the first wall time / env steps at which their mean reaches --target is the time to
target. At the end, --final-episodes greedy episodes. Progress goes to stderr; the last stdout line is one JSON
object.
"""
import time

LAUNCH = time.time()  # wall clock from process launch: before every other import

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # nothing to report to: no internet here
# Ray 2.60.0 turns _node_ip_address="127.0.0.1" into the host's routable IP and binds its gRPC servers (GCS, raylet,
# workers) on every interface; this flag, read when ray is imported and inherited by every Ray process, keeps the
# node IP on loopback, so they all bind 127.0.0.1 (checked with ss -ltnup).
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402
import ray  # noqa: E402
import torch  # noqa: E402
from ray.rllib.algorithms.ppo import PPOConfig  # noqa: E402
from ray.rllib.core import DEFAULT_MODULE_ID  # noqa: E402
from ray.rllib.core.columns import Columns  # noqa: E402
from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig  # noqa: E402

ENV = "CartPole-v1"
# rllib/examples/algorithms/ppo/cartpole_ppo.py (ray-project/ray); the rest stays PPOConfig's default
TUNED_TRAINING = dict(lr=0.0003, num_epochs=6, vf_loss_coeff=0.01)
TUNED_MODEL = dict(fcnet_hiddens=[32], fcnet_activation="linear", vf_share_layers=True)


def log(message: str) -> None:
    print(f"[{time.time() - LAUNCH:7.1f}s] {message}", file=sys.stderr, flush=True)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env-runners", type=int, default=2, help="num_env_runners (one env each)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--env-steps", type=int, default=500_000, help="budget of sampled env steps")
    parser.add_argument("--target", type=float, default=475.0, help="greedy mean return that counts as solved")
    parser.add_argument("--max-seconds", type=float, default=None, help="wall budget, from process launch")
    parser.add_argument("--eval-every", type=int, default=25_000, help="env steps between greedy evaluations")
    parser.add_argument("--eval-episodes", type=int, default=16)
    parser.add_argument("--final-episodes", type=int, default=100)
    return parser.parse_args()


def make_config(args: argparse.Namespace) -> PPOConfig:
    return (
        PPOConfig()
        .api_stack(enable_rl_module_and_learner=True, enable_env_runner_and_connector_v2=True)
        .environment(ENV)
        .framework("torch")
        .env_runners(num_env_runners=args.env_runners, num_envs_per_env_runner=1)
        .learners(num_learners=0, num_gpus_per_learner=0)
        .training(**TUNED_TRAINING)
        .rl_module(model_config=DefaultModelConfig(**TUNED_MODEL))
        .debugging(seed=args.seed)
    )


def greedy_returns(module, episodes: int, seed: int) -> np.ndarray:
    """Undiscounted returns of `episodes` CartPole-v1 episodes (seeds seed, seed+1, ...) played side by side with
    the module's argmax action: one forward_inference per step over the envs still running."""
    envs = [gym.make(ENV) for _ in range(episodes)]
    obs = np.stack([env.reset(seed=seed + i)[0] for i, env in enumerate(envs)])
    returns = np.zeros(episodes)
    alive = np.ones(episodes, dtype=bool)
    with torch.no_grad():
        while alive.any():
            index = np.flatnonzero(alive)
            logits = module.forward_inference({Columns.OBS: torch.as_tensor(obs[index], dtype=torch.float32)})
            actions = logits[Columns.ACTION_DIST_INPUTS].argmax(dim=-1).numpy()
            for i, action in zip(index, actions, strict=True):
                o, reward, terminated, truncated, _ = envs[i].step(int(action))
                returns[i] += float(reward)
                obs[i] = o
                if terminated or truncated:
                    alive[i] = False
    for env in envs:
        env.close()
    return returns


def env_steps_of(result: dict) -> int:
    value = result.get("num_env_steps_sampled_lifetime")
    if value is None:
        value = result["env_runners"]["num_env_steps_sampled_lifetime"]
    return int(value)


def main() -> int:
    args = parse_args()
    # a Ray of its own (address="local": never join a cluster another job left running), on loopback, one CPU slot
    # per EnvRunner plus one for the driver's local Learner
    ray.init(address="local", num_cpus=args.env_runners + 1, include_dashboard=False,
             _node_ip_address="127.0.0.1", logging_level="WARNING")
    node_ip = ray._private.worker.global_worker.node.node_ip_address
    log(f"ray node IP {node_ip}" + ("" if node_ip == "127.0.0.1" else " (NOT loopback: Ray listens beyond this host)"))
    try:
        config = make_config(args)
        algo = config.build_algo() if hasattr(config, "build_algo") else config.build()
        module = algo.learner_group._learner.module[DEFAULT_MODULE_ID]  # the local Learner's (trained) module
        startup_seconds = time.time() - LAUNCH
        log(f"ray {ray.__version__}, algo built; {args.env_runners} env runners")
        eval_seed = 10_000 + 1_000 * args.seed  # episodes the EnvRunners never see
        history, evals = [], []
        train_seconds = eval_seconds = 0.0
        env_steps, next_eval = 0, args.eval_every
        first_steps = first_seconds = None
        while env_steps < args.env_steps and (args.max_seconds is None or time.time() - LAUNCH < args.max_seconds):
            t0 = time.time()
            result = algo.train()
            train_seconds += time.time() - t0
            env_steps = env_steps_of(result)
            wall = time.time() - LAUNCH
            episode_mean = result.get("env_runners", {}).get("episode_return_mean")
            history.append({"iteration": len(history) + 1, "env_steps": env_steps, "wall_seconds": round(wall, 2),
                            "episode_return_mean": None if episode_mean is None else round(float(episode_mean), 2)})
            message = f"iter {len(history)}: env steps {env_steps}, sampled-episode return mean {episode_mean}"
            if env_steps >= next_eval:
                while next_eval <= env_steps:
                    next_eval += args.eval_every
                t0 = time.time()
                mean = float(greedy_returns(module, args.eval_episodes, eval_seed).mean())
                eval_seconds += time.time() - t0
                wall = time.time() - LAUNCH
                evals.append({"env_steps": env_steps, "wall_seconds": round(wall, 2), "greedy_mean": mean})
                message += f", greedy mean of {args.eval_episodes}: {mean:.1f}"
                if first_steps is None and mean >= args.target:
                    first_steps, first_seconds = env_steps, wall
            log(message)
        t0 = time.time()
        final = greedy_returns(module, args.final_episodes, eval_seed + 500)
        eval_seconds += time.time() - t0
        log(f"final greedy mean of {args.final_episodes}: {final.mean():.1f} (min {final.min():.0f})")
        settings = {
            "source": "rllib/examples/algorithms/ppo/cartpole_ppo.py",
            "api_stack": {"enable_rl_module_and_learner": config.enable_rl_module_and_learner,
                          "enable_env_runner_and_connector_v2": config.enable_env_runner_and_connector_v2},
            "env": ENV, "framework": config.framework_str,
            "num_env_runners": config.num_env_runners, "num_envs_per_env_runner": config.num_envs_per_env_runner,
            "num_learners": config.num_learners, "num_gpus_per_learner": config.num_gpus_per_learner,
            "train_batch_size_per_learner": config.train_batch_size_per_learner,
            "minibatch_size": config.minibatch_size, "num_epochs": config.num_epochs, "lr": config.lr,
            "gamma": config.gamma, "lambda": config.lambda_, "clip_param": config.clip_param,
            "vf_clip_param": config.vf_clip_param, "vf_loss_coeff": config.vf_loss_coeff,
            "entropy_coeff": config.entropy_coeff, "use_kl_loss": config.use_kl_loss, "kl_coeff": config.kl_coeff,
            "kl_target": config.kl_target, "grad_clip": config.grad_clip,
            "rollout_fragment_length": config.get_rollout_fragment_length(), "batch_mode": config.batch_mode,
            "model": TUNED_MODEL, "seed": args.seed, "eval_every_env_steps": args.eval_every,
            "eval_episodes": args.eval_episodes, "final_episodes": args.final_episodes, "target": args.target,
            "env_steps_budget": args.env_steps, "max_seconds": args.max_seconds,
            "ray_num_cpus": args.env_runners + 1, "torch": torch.__version__, "gymnasium": gym.__version__,
        }
        algo.stop()
    finally:
        ray.shutdown()
    wall_seconds = time.time() - LAUNCH
    print(json.dumps({"history": history, "evals": evals}), flush=True)
    print(json.dumps({
        "env_steps": env_steps,
        "wall_seconds": round(wall_seconds, 1),
        "env_steps_per_second": round(env_steps / train_seconds, 1),
        "first_target_env_steps": first_steps,
        "first_target_seconds": None if first_seconds is None else round(first_seconds, 1),
        "final_greedy_return": float(final.mean()),
        "final_returns_min": float(final.min()),
        "ray_version": ray.__version__,
        "env_runners": args.env_runners,
        "startup_seconds": round(startup_seconds, 1),
        "train_seconds": round(train_seconds, 1),
        "eval_seconds": round(eval_seconds, 1),
        "iterations": len(history),
        "settings": settings,
    }), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
