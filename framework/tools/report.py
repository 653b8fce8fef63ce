"""Aggregate finished runs into one report: a table per configuration and their learning curves.

PATH may be a run dir, a multirun dir or any folder holding run dirs (each finished one has summary.json).
Runs are grouped into configurations (their Hydra overrides without seed=); every seed of every run,
vmapped or Hydra, counts as one seed. Prints the table and writes report.md and learning_curves.png
into --output (default: PATH).

    python -m lightspeed.framework.tools.report PATH [--output DIR]
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import textwrap
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import yaml  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402
from scipy.stats import trim_mean  # noqa: E402

from lightspeed.framework.tools.command_line import OneParagraphParser  # noqa: E402

RESAMPLES = 2000
MISSING = "-"
HEADERS = ["configuration", "runs", "seeds", "final mean", "final IQM [95% CI]", "best-policy IQM", "solved",
           "stability", "median steps to solve", "median s to solve", "env steps/s"]


@dataclass
class Run:
    path: Path
    config: dict
    summary: dict
    overrides: list[str]
    eval_steps: np.ndarray  # (evaluations,)
    eval_returns: np.ndarray  # (evaluations, seeds); NaN where the run logged null


def natural_key(path: Path) -> list:
    """Sort job dirs 0, 1, 2, ..., 10 rather than 0, 1, 10, 2."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", str(path))]


def find_run_dirs(root: Path) -> list[Path]:
    """Every run dir under root, finished or not (a failed job has .hydra/ but no summary.json)."""
    markers = [*root.rglob("summary.json"), *root.rglob("metrics.jsonl")]
    dirs = ({marker.parent for marker in markers}
            | {hydra.parent.parent for hydra in root.rglob(".hydra/overrides.yaml")})
    return sorted(dirs, key=natural_key)


def read_eval_curve(metrics_path: Path) -> tuple[np.ndarray, np.ndarray]:
    """The env steps and per-seed greedy returns of every evaluation line in metrics.jsonl."""
    records = ([json.loads(line) for line in metrics_path.read_text().splitlines() if line.strip()]
               if metrics_path.exists() else [])
    evaluations = [r for r in records if "eval/return_per_seed" in r]
    steps = np.array([r["env_steps"] for r in evaluations], dtype=float)
    returns = np.array([[np.nan if v is None else v for v in r["eval/return_per_seed"]] for r in evaluations],
                       dtype=float)
    return steps, returns.reshape(len(evaluations), -1)


def load_run(run_dir: Path) -> Run:
    """One finished run; raises if a file is missing or unreadable."""
    summary = json.loads((run_dir / "summary.json").read_text())
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    overrides_path = run_dir / ".hydra" / "overrides.yaml"
    overrides = (yaml.safe_load(overrides_path.read_text()) or []) if overrides_path.exists() else []
    steps, returns = read_eval_curve(run_dir / "metrics.jsonl")
    return Run(run_dir, config, summary, [str(item) for item in overrides], steps, returns)


def load_runs(root: Path) -> tuple[list[Run], list[tuple[Path, str]]]:
    """Finished runs under root, and the (run dir, reason) of those skipped."""
    runs, skipped = [], []
    for run_dir in find_run_dirs(root):
        if not (run_dir / "summary.json").exists():
            skipped.append((run_dir, "no summary.json: the job did not finish"))
            continue
        try:
            runs.append(load_run(run_dir))
        except (OSError, ValueError, KeyError, TypeError, yaml.YAMLError) as error:
            skipped.append((run_dir, f"unreadable: {error}"))
    return runs, skipped


def configuration_overrides(run: Run) -> list[str]:
    """The run's overrides that define what was run: without seed= (one seed of many) and hydra.* (bookkeeping)."""
    keys = [item.split("=", 1)[0].lstrip("+~") for item in run.overrides]
    return sorted(item for item, key in zip(run.overrides, keys, strict=True)
                  if key != "seed" and not key.startswith(("hydra.", "hydra/")))


def configuration_key(run: Run) -> str:
    return " ".join(configuration_overrides(run)) or f"{run.config['algo']['name']} on {run.config['env']['name']}"


def group_runs(runs: Sequence[Run]) -> dict[str, list[Run]]:
    """Runs by configuration key, keys sorted."""
    groups: dict[str, list[Run]] = {}
    for run in runs:
        groups.setdefault(configuration_key(run), []).append(run)
    return dict(sorted(groups.items()))


def display_names(groups: dict[str, list[Run]]) -> tuple[dict[str, str], list[str]]:
    """Short names: each key without the overrides every configuration shares (those are returned once)."""
    override_sets = {key: configuration_overrides(runs[0]) for key, runs in groups.items()}
    shared = set.intersection(*(set(items) for items in override_sets.values())) if override_sets else set()
    names = {}
    for key, items in override_sets.items():
        config = groups[key][0].config
        names[key] = (" ".join(i for i in items if i not in shared)
                      or f"{config['algo']['name']} on {config['env']['name']}")
    return names, sorted(shared)


def iqm(values: np.ndarray, axis: Optional[int] = None) -> np.ndarray:
    """Interquartile mean: the mean of the middle 50% (rliable's aggregate_iqm, per point along `axis`)."""
    return trim_mean(np.asarray(values, dtype=float), 0.25, axis=axis)


def iqm_interval(scores: np.ndarray, resamples: int = RESAMPLES,
                 confidence: float = 0.95) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """IQM over seeds and its stratified-bootstrap CI (rliable), for scores [seeds] or [seeds, points].

    Returns (IQM, low, high), each a number or [points]. rliable's bootstrap resamples the seeds
    (runs) with replacement, independently at each point.
    """
    from rliable import library  # imports pandas, arch and seaborn: ~1-2 s the trainer need not pay

    scores = np.asarray(scores, dtype=float)
    points = scores.reshape(len(scores), 1, -1)  # (runs, tasks=1, points)
    per_point = lambda sampled: iqm(sampled.reshape(len(sampled), -1), axis=0)  # aggregate_iqm at each point
    # rliable 1.2 draws its resampling indices from numpy's global generator (its random_state
    # reaches only arch, which it does not use): seed that one, so the same runs give the same report
    saved_state = np.random.get_state()
    np.random.seed(0)
    try:
        estimate, interval = library.get_interval_estimates({"scores": points}, per_point, reps=resamples,
                                                            confidence_interval_size=confidence)
    finally:
        np.random.set_state(saved_state)
    shape = scores.shape[1:]
    low, high = interval["scores"]
    return estimate["scores"].reshape(shape), low.reshape(shape), high.reshape(shape)


def pooled_stability(seeds: Sequence[dict]) -> Optional[float]:
    """Of every seed's evaluations after it first reached the target, the fraction still at or above it."""
    counted = [(seed["stability"], seed["evaluations_after_target"]) for seed in seeds
               if seed.get("stability") is not None and seed.get("evaluations_after_target")]
    total = sum(count for _, count in counted)
    return sum(fraction * count for fraction, count in counted) / total if total else None


def aggregate_row(runs: Sequence[Run]) -> dict:
    """The numbers of one configuration, over every seed of every run."""
    seeds = [seed for run in runs for seed in run.summary["seeds"]]
    finals = np.array([seed["final_eval_return"] for seed in seeds], dtype=float)
    bests = [seed["best_policy_eval_return"] for seed in seeds if seed.get("best_policy_eval_return") is not None]
    solved = [seed for seed in seeds if seed["solved_at_env_steps"] is not None]
    target = runs[0].config.get("target_return")
    final_iqm, low, high = iqm_interval(finals)
    median = lambda key: float(np.median([seed[key] for seed in solved])) if solved else None
    return {"runs": len(runs), "seeds": len(seeds), "mean_return": float(finals.mean()), "iqm_return": float(final_iqm),
            "iqm_ci": (float(low), float(high)),
            "best_policy_iqm": float(iqm(bests)) if len(bests) == len(seeds) else None,
            "solved_count": len(solved), "solved_fraction": None if target is None else len(solved) / len(seeds),
            "stability": pooled_stability(seeds),
            "median_steps_to_solve": median("solved_at_env_steps"),
            "median_seconds_to_solve": median("solved_at_seconds"),
            "env_steps_per_second": float(np.mean([run.summary["env_steps_per_second"] for run in runs]))}


def format_cells(name: str, row: dict) -> list[str]:
    low, high = row["iqm_ci"]
    solved = (MISSING if row["solved_fraction"] is None
              else f"{row['solved_fraction']:.2f} ({row['solved_count']}/{row['seeds']})")
    optional = lambda value, spec: MISSING if value is None else format(value, spec)
    return [name, str(row["runs"]), str(row["seeds"]), f"{row['mean_return']:.3f}",
            f"{row['iqm_return']:.3f} [{low:.3f}, {high:.3f}]", optional(row["best_policy_iqm"], ".3f"), solved,
            optional(row["stability"], ".2f"), optional(row["median_steps_to_solve"], ",.0f"),
            optional(row["median_seconds_to_solve"], ".1f"), f"{row['env_steps_per_second']:,.0f}"]


def render_table(cells: Sequence[Sequence[str]], headers: Sequence[str] = HEADERS) -> str:
    """Plain-text table: the name column left-aligned, numbers right-aligned."""
    widths = [max(len(line[i]) for line in [headers, *cells]) for i in range(len(headers))]
    align = lambda line: "  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                                   for i, (c, w) in enumerate(zip(line, widths, strict=True)))
    return "\n".join([align(headers), "  ".join("-" * w for w in widths), *map(align, cells)])


def render_markdown(cells: Sequence[Sequence[str]], notes: Sequence[str], title: str,
                    headers: Sequence[str] = HEADERS) -> str:
    line = lambda items: "| " + " | ".join(item.replace("|", "\\|") for item in items) + " |"
    rule = "|" + "|".join([":---", *["---:"] * (len(headers) - 1)]) + "|"
    parts = [f"# {title}", "", line(headers), rule, *map(line, cells), "", *[f"{n}\n" for n in notes]]
    return "\n".join(parts).rstrip() + "\n"


def interpolate_finite(grid: np.ndarray, steps: np.ndarray, values: np.ndarray) -> np.ndarray:
    finite = np.isfinite(values)
    return np.interp(grid, steps[finite], values[finite]) if finite.any() else np.full(len(grid), np.nan)


def configuration_curve(runs: Sequence[Run]) -> tuple[np.ndarray, np.ndarray]:
    """Every seed's returns (seeds, points) on the union of its runs' evaluation steps."""
    grid = np.unique(np.concatenate([run.eval_steps for run in runs]))
    # union grid + np.interp, which holds a run's last value past its end: runs stop early once every seed is solved
    per_seed = [interpolate_finite(grid, run.eval_steps, column)
                for run in runs if len(run.eval_steps) for column in run.eval_returns.T]
    return grid, np.array(per_seed).reshape(len(per_seed), len(grid))


def format_count(value: float, _position: object = None) -> str:
    """1500 -> 1.5k, 2000000 -> 2M: readable env-step ticks."""
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:g}{suffix}"
    return f"{value:g}"


def plot_learning_curves(curves: dict[str, tuple[np.ndarray, np.ndarray]], path: Path,
                         eval_episodes: str, target_return: Optional[float]) -> None:
    """IQM of the greedy return over seeds per configuration, with a shaded stratified-bootstrap 95% CI band."""
    with plt.rc_context({"font.size": 12, "legend.fontsize": 10}), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # points where every seed is NaN stay NaN, without noise
        figure, axes = plt.subplots(figsize=(10, 5.5 + 0.45 * len(curves)))
        for name, (steps, per_seed) in curves.items():
            per_seed = per_seed[np.isfinite(per_seed).all(axis=1)]  # a seed with no finite evaluation has no curve
            if per_seed.size == 0:
                continue
            curve, low, high = iqm_interval(per_seed)
            (line,) = axes.plot(steps, curve, marker="o", markersize=3, linewidth=2,
                                label=textwrap.fill(f"{name} ({len(per_seed)} seeds)", 110))
            axes.fill_between(steps, low, high, color=line.get_color(), alpha=0.2, linewidth=0)
        if target_return is not None:
            axes.axhline(target_return, color="black", linestyle="--", linewidth=1.2,
                         label=f"target_return {target_return:g}")
        axes.xaxis.set_major_formatter(FuncFormatter(format_count))
        axes.set(xlabel="env steps (per seed)", ylabel=f"greedy evaluation return\n(mean of {eval_episodes} episodes)",
                 title="Learning curves: IQM over seeds, stratified-bootstrap 95% CI")
        axes.grid(alpha=0.3)
        # below the axes: long override lists must not cover the curves
        axes.legend(loc="upper left", bbox_to_anchor=(0.0, -0.14), frameon=False)
        figure.savefig(path, dpi=120, bbox_inches="tight")
        plt.close(figure)


def shared_value(runs: Sequence[Run], key: str) -> set:
    return {run.config.get(key) for run in runs}


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = OneParagraphParser("python -m lightspeed.framework.tools.report", __doc__)
    parser.add_argument("path", type=Path, help="a run dir, a multirun dir, or any folder holding run dirs")
    parser.add_argument("--output", type=Path, default=None,
                        help="where report.md and learning_curves.png go (default: PATH)")
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    root, output = args.path, args.output or args.path
    if not root.is_dir():
        print(f"report: {root} is not a directory (give a run dir or a multirun dir)", file=sys.stderr)
        return 2
    runs, skipped = load_runs(root)
    skipped_text = "; ".join(f"{path.relative_to(root)} ({reason})" for path, reason in skipped)
    if not runs:
        print(f"report: no finished run (a dir with summary.json) under {root}"
              + (f"; skipped {skipped_text}" if skipped else ""), file=sys.stderr)
        return 2
    groups = group_runs(runs)
    names, shared = display_names(groups)
    cells = [format_cells(names[key], aggregate_row(group)) for key, group in groups.items()]
    seeds = sum(len(run.summary["seeds"]) for run in runs)
    final_episodes = "/".join(sorted({str(run.summary.get("final_eval_episodes", "the last periodic"))
                                      for run in runs}))
    notes = [f"Read {len(runs)} runs ({seeds} seeds) in {len(groups)} configurations from {root}; "
             + (f"skipped {len(skipped)}: {skipped_text}." if skipped else "skipped none."),
             f"Overrides shared by every configuration: {' '.join(shared) or 'none'}.",
             f"final: each seed's final greedy evaluation ({final_episodes} episodes); IQM: interquartile mean over "
             f"seeds; CI: rliable's stratified bootstrap over seeds ({RESAMPLES} resamples); best-policy: the same "
             "evaluation of each seed's best periodic policy; stability: of the periodic evaluations after a "
             "seed first reached target_return, the fraction still at or above it (pooled over seeds)."]
    for _, reason in skipped:
        print(f"warning: skipped a run dir ({reason})", file=sys.stderr)
    targets, episodes = shared_value(runs, "target_return"), shared_value(runs, "eval_episodes")
    try:
        output.mkdir(parents=True, exist_ok=True)
        (output / "report.md").write_text(render_markdown(cells, notes, f"Report: {root}"))
        curves = {names[key]: configuration_curve(group) for key, group in groups.items()}
        plot_learning_curves(curves, output / "learning_curves.png",
                             "/".join(str(e) for e in sorted(episodes, key=str)),
                             targets.pop() if len(targets) == 1 else None)
    except OSError as error:
        print(f"report: cannot write into {output}: {error}", file=sys.stderr)
        return 2
    print(render_table(cells), *notes, f"Wrote {output / 'report.md'} and {output / 'learning_curves.png'}", sep="\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
