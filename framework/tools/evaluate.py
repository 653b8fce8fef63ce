"""Play a run's saved policies and print every seed's greedy returns.

    python -m lightspeed.framework.tools.evaluate RUN_DIR [--which final|best] [--episodes N] [--seed N] [--gif PATH]

Every seed's saved policy plays N greedy episodes of the run's own env (its saved env params), a
table of their returns is printed and `evaluation.json` is written into the run dir. With the
run's seed (the default) and its `final_eval_episodes` (default 100) the episodes are those of the
run's own final evaluation, so the returns are the same. `--gif` animates seed 0's first episode of
the table (the first of its returns in evaluation.json): the same keys, the same episode.
"""
import argparse
import json
import math
import sys
from pathlib import Path
from typing import Optional, Sequence

import jax
import numpy as np

from lightspeed.framework.core.env import can_render
from lightspeed.framework.core.errors import ConfigError, check, check_writable_dir
from lightspeed.framework.core.evaluation import make_evaluate, make_record_episode
from lightspeed.framework.core.keys import FINAL_EVALUATION, run_keys
from lightspeed.framework.run.policy import KINDS, SavedPolicies, load_policies, products_as_the_run
from lightspeed.framework.tools.command_line import OneParagraphParser

GIF_MAX_FPS = 25  # viewers slow down frames shorter than 20-40 ms: faster envs show every k-th step
GIF_LAST_FRAME_MS = 1000


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = OneParagraphParser("python -m lightspeed.framework.tools.evaluate", __doc__)
    parser.add_argument("run_dir", type=Path, help="a run dir written by run.py")
    parser.add_argument("--which", default="final", help="final (the policy the run ended with) or best")
    parser.add_argument("--episodes", type=int, default=100, help="greedy episodes per seed (default 100)")
    parser.add_argument("--seed", type=int, default=None, help="the episodes' seed (default: the run's own)")
    parser.add_argument("--gif", type=Path, default=None, help="write an animation of seed 0's first episode here")
    return parser.parse_args(argv)


def check_args(args: argparse.Namespace) -> None:
    """Bad input named before anything loads or compiles."""
    check(args.which in KINDS, "--which", args.which, " or ".join(KINDS))
    check(args.episodes > 0, "--episodes", args.episodes, "an integer >= 1")
    check(args.seed is None or 0 <= args.seed < 2**32, "--seed", args.seed, "an integer from 0 to 2**32 - 1")
    if args.gif is not None:
        check(args.gif.suffix.lower() == ".gif", "--gif", str(args.gif), "a path ending in .gif")
        check_writable_dir(args.gif.parent.resolve(), "--gif")


def play(saved: SavedPolicies, episodes: int, seed: int) -> np.ndarray:
    """Every seed's returns [S, episodes], on the keys of the run's final evaluation for `seed`."""
    num_seeds = saved.meta["num_seeds"]
    if getattr(saved.env, "host", False):  # a gymnasium env: the final evaluation's episode seeds
        from lightspeed.framework.sebulba.trainer import evaluation_seed, greedy_returns

        return greedy_returns(saved.env, saved.algorithm, saved.policies, num_seeds, episodes,
                              evaluation_seed(seed, num_seeds, -1))
    evaluate_one_seed = make_evaluate(saved.env, saved.env_params, saved.algorithm, episodes)
    keys = run_keys(np.uint32(seed), np.int32(FINAL_EVALUATION), num_seeds)[1]
    return np.asarray(jax.jit(jax.vmap(evaluate_one_seed))(saved.policies, keys))


def evaluate(run_dir: Path | str, episodes: int = 100, which: str = "final", seed: Optional[int] = None) -> np.ndarray:
    """Play a finished run's saved greedy policies: every seed's returns [seeds, episodes], on the keys (or episode
    seeds) of the run's own final evaluation unless `seed` names another base."""
    check(isinstance(episodes, int) and episodes >= 1, "episodes", episodes, "an integer >= 1")
    saved = load_policies(Path(run_dir), which)
    with products_as_the_run(saved.meta):
        return play(saved, episodes, saved.meta["seed"] if seed is None else seed)


def record_gif(saved: SavedPolicies, seed: int, episodes: int, path: Path) -> tuple[float, int]:
    """Seed 0's first episode of `play(saved, episodes, seed)` as an animated GIF; its return and length."""
    env = saved.env
    if getattr(env, "host", False):
        return record_host_gif(saved, seed, path)
    if not can_render(env):
        raise ConfigError("--gif", str(path), "an env with a render(state, params) method",
                          f"env={saved.meta['env']['name']} cannot draw itself")
    first_seed = jax.tree.map(lambda leaf: leaf[0], saved.policies)
    key = run_keys(np.uint32(seed), np.int32(FINAL_EVALUATION), saved.meta["num_seeds"])[1][0]
    record = make_record_episode(env, saved.env_params, saved.algorithm, episodes)
    states, rewards, steps = jax.jit(record)(first_seed, key)
    steps = int(steps)
    states = jax.device_get(states)
    episode = [jax.tree.map(lambda leaf, t=t: leaf[t], states) for t in range(steps + 1)]
    frames = env.render_episode(episode, saved.env_params)
    write_gif(frames, path, env.render_fps)
    return float(np.asarray(rewards).sum()), steps


def record_host_gif(saved: SavedPolicies, seed: int, path: Path) -> tuple[float, int]:
    """A gymnasium env's frames (`rgb_array`) of seed 0's first final-evaluation episode: its seed, its actions."""
    from lightspeed.framework.core.evaluation import HostEpisodesAct
    from lightspeed.framework.core.host_env import EpisodeExploration, encode_observations, env_action
    from lightspeed.framework.core.spaces import from_gymnasium
    from lightspeed.framework.sebulba.trainer import evaluation_epsilon, evaluation_seed

    try:
        env = saved.env.evaluation_env(render_mode="rgb_array")
        env.reset(seed=0)
        env.render()
    except Exception as error:  # the env's own drawing code (pygame for classic control) or its absence
        raise ConfigError("--gif", str(path), f"an env that draws rgb_array frames ({saved.env.name} needs: "
                          f"{error})", "its render failed") from None
    episodes_act = HostEpisodesAct(saved.algorithm, (1,), 1)  # seed 0's first episode, as the evaluation acts it
    first_seed = jax.tree.map(lambda leaf: leaf[:1], saved.policies)
    episode_seed = evaluation_seed(seed, saved.meta["num_seeds"], -1)
    epsilon = evaluation_epsilon(saved.env)
    explore = EpisodeExploration(episode_seed, epsilon, int(env.action_space.n)) if epsilon else (lambda a: a)
    to_env = env_action(from_gymnasium(env.action_space))
    try:
        obs, _ = env.reset(seed=episode_seed)
        frames, total, steps, done = [env.render()], 0.0, 0, False
        while not done:
            batch = encode_observations(env.observation_space, np.asarray(obs)[None])[None]
            action = episodes_act(first_seed, batch, np.array([[steps == 0]]), np.array([[episode_seed % 2**32]]))
            obs, reward, terminated, truncated, _ = env.step(to_env(explore(action[0, 0])))
            frames.append(env.render())
            total, steps, done = total + float(reward), steps + 1, terminated or truncated
    finally:
        env.close()
    write_gif(frames, path, int(env.metadata.get("render_fps") or 30))
    return total, steps


def write_gif(frames: list[np.ndarray], path: Path, fps: int) -> None:
    """Frames at the env's real-time speed (every k-th when it is faster than viewers show), the last held."""
    from PIL import Image  # Pillow: matplotlib's own image dependency

    stride = max(1, math.ceil(fps / GIF_MAX_FPS))
    shown = frames[::stride] if (len(frames) - 1) % stride == 0 else frames[::stride] + [frames[-1]]
    durations = [round(1000 * stride / fps)] * (len(shown) - 1) + [GIF_LAST_FRAME_MS]
    images = [Image.fromarray(frame) for frame in shown]
    partial = path.with_name(path.name + ".partial")
    images[0].save(partial, format="GIF", save_all=True, append_images=images[1:], duration=durations, loop=0)
    partial.replace(path)


def run_results(run_dir: Path, which: str, episodes: int) -> Optional[list[float]]:
    """The run's own final-evaluation return per seed for `which`, when it played the same episodes."""
    path = run_dir / "summary.json"
    summary = json.loads(path.read_text()) if path.is_file() else {}
    if summary.get("final_eval_episodes") != episodes:
        return None
    field = "final_eval_return" if which == "final" else "best_policy_eval_return"
    return [seed.get(field) for seed in summary["seeds"]]


def format_table(returns: np.ndarray, reported: Optional[list[float]]) -> str:
    """Mean, std, min and max per seed, and the run's own number beside each when it has one."""
    header = (f"{'seed':>4}  {'mean':>8}  {'std':>7}  {'min':>8}  {'max':>8}"
              + ("  run's final eval" if reported else ""))
    rows = [header]
    for index, seed_returns in enumerate(returns):
        row = (f"{index:>4}  {seed_returns.mean():>8.2f}  {seed_returns.std():>7.2f}  {seed_returns.min():>8.2f}  "
               f"{seed_returns.max():>8.2f}")
        if reported and reported[index] is not None:
            row += f"  {reported[index]:>16.2f}"
        rows.append(row)
    rows.append(f"{'all':>4}  {returns.mean(axis=1).mean():>8.2f}  (mean over seeds of the per-seed means)")
    return "\n".join(rows)


def evaluation_record(args: argparse.Namespace, seed: int, returns: np.ndarray, gif: Optional[dict]) -> dict:
    return {
        "which": args.which, "episodes": args.episodes, "seed": seed,
        "mean_return": float(returns.mean(axis=1).mean()),
        "seeds": [{"seed_index": index, "mean": float(r.mean()), "std": float(r.std()), "min": float(r.min()),
                   "max": float(r.max()), "returns": r.tolist()} for index, r in enumerate(returns)],
        "gif": gif,
    }


def gif_entry(saved: SavedPolicies, seed: int, episodes: int, path: Path) -> dict:
    """record_gif, said on stdout; the evaluation record's "gif" entry."""
    episode_return, steps = record_gif(saved, seed, episodes, path)
    print(f"wrote {path}: seed 0's first episode of the {episodes} above, return {episode_return:g} in {steps} steps")
    return {"path": str(path), "seed_index": 0, "episode_index": 0, "return": episode_return, "steps": steps}


def main(argv: Sequence[str]) -> dict:
    args = parse_args(argv)
    check_args(args)
    saved = load_policies(args.run_dir, args.which)
    seed = saved.meta["seed"] if args.seed is None else args.seed
    same_seed = args.seed is None or args.seed == saved.meta["seed"]
    with products_as_the_run(saved.meta):
        returns = play(saved, args.episodes, seed)
        print(f"{args.which} policies of {args.run_dir} ({saved.meta['algo']['name']} on {saved.env.name}): "
              f"{args.episodes} greedy episodes per seed, seed {seed}")
        print(format_table(returns, run_results(args.run_dir, args.which, args.episodes) if same_seed else None))
        gif = gif_entry(saved, seed, args.episodes, args.gif) if args.gif is not None else None
    record = evaluation_record(args, seed, returns, gif)
    (args.run_dir / "evaluation.json").write_text(json.dumps(record, indent=2))
    return record


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except ConfigError as error:
        print(error, file=sys.stderr)
        sys.exit(2)
