"""DQN on CartPole-v1 under the evaluation protocol, lightspeed next to stable-baselines3.

    python bench/bench_dqn.py [--seeds 10] [--sb3-seeds 3] [--skip-sb3]

lightspeed: `run.py algo=dqn env=cartpole num_seeds=10` (`DQNConfig`'s defaults with
conf/algo_env/dqn_cartpole.yaml), ten seeds vmapped in one process. With `target_return=475`: seconds
from launch until every seed is solved by the sustained rule (3 periodic evaluations in a row >= 475),
cold (no compilation cache) and relaunched with a filled cache. Without a target: the default-length
run's final 100-episode greedy return per seed (IQM and 95% CI with rliable) and its stability (of the
evaluations after a seed first reached 475, the fraction still >= 475). stable-baselines3: its DQN with
the rl-zoo CartPole-v1 hyperparameters for its 50k steps, one process per seed, evaluated greedily on 16
episodes every 5,000 steps (time to its first evaluation >= 475) and on 100 at the end. Times count
from interpreter start (imports and compilation included). Needs stable-baselines3 (with torch).
"""
import argparse

from shared import print_machine, print_protocol_table

TARGET = 475.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10, help="lightspeed seeds, vmapped in one run")
    parser.add_argument("--seed", type=int, default=0, help="lightspeed's seed base")
    parser.add_argument("--sb3-seeds", type=int, default=3)
    parser.add_argument("--skip-sb3", action="store_true")
    args = parser.parse_args()

    print_machine("lightspeed DQN benchmark")
    overrides = ("algo=dqn", "env=cartpole", f"num_seeds={args.seeds}", f"seed={args.seed}")
    print_protocol_table(f"DQN on CartPole-v1: sustained solve (3 evaluations in a row >= {TARGET:.0f}) and the final "
                         "100-episode greedy return", {f"lightspeed DQN, {args.seeds} seeds in one process": overrides},
                         TARGET, 0 if args.skip_sb3 else args.sb3_seeds)


if __name__ == "__main__":
    main()
