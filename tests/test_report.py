"""lightspeed.framework.tools.report: statistics, grouping and the files it writes, on hand-made run dirs and on one
real multirun."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from conftest import ROOT
from scipy.stats import trim_mean

from lightspeed.framework.tools import report


def write_run(run_dir: Path, overrides: list[str], finals: list[float], solved_steps: list | None = None,
              solved_seconds: list | None = None, steps_per_second: float = 1000.0, target_return: float | None = None,
              eval_steps: tuple = (100, 200), summary: bool = True) -> Path:
    """A run dir as run.py writes it; eval curves end at the given final returns."""
    solved_steps = solved_steps or [None] * len(finals)
    solved_seconds = solved_seconds or [None if s is None else s / 100 for s in solved_steps]
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    config = {"algo": {"name": "dqn"}, "env": {"name": "cartpole"}, "seed": 0, "num_seeds": len(finals),
              "target_return": target_return, "eval_episodes": 8}
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    if not summary:
        return run_dir
    lines = [{"env_steps": step, "wall_seconds": 1.0, "env_steps_per_second": steps_per_second,
              "eval/return": float(np.mean(finals)),
              "eval/return_per_seed": [f * (i + 1) / len(eval_steps) for f in finals]}
             for i, step in enumerate(eval_steps)]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    seeds = [{"seed_index": i, "final_eval_return": f, "solved_at_env_steps": s, "solved_at_seconds": t}
             for i, (f, s, t) in enumerate(zip(finals, solved_steps, solved_seconds, strict=True))]
    (run_dir / "summary.json").write_text(json.dumps({
        "seeds": seeds, "env_steps": eval_steps[-1], "env_steps_per_second": steps_per_second,
        "env_steps_per_second_per_seed": steps_per_second / len(finals), "compile_seconds": 1.0, "wall_seconds": 2.0,
        "num_devices": 1}))
    return run_dir


def markdown_rows(report_md: str) -> dict[str, list[str]]:
    """Table rows of report.md by configuration name."""
    rows = [[cell.strip() for cell in line.strip("|").split("|")]
            for line in report_md.splitlines() if line.startswith("| ")]
    return {row[0]: row for row in rows[1:]}


def run_report(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lightspeed.framework.tools.report", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def test_iqm_is_the_mean_of_the_middle_half():
    assert report.iqm([1, 2, 3, 4, 5, 6, 7, 8]) == pytest.approx(4.5)
    assert report.iqm([8, 1, 100, 2]) == pytest.approx((2 + 8) / 2)  # one dropped from each end
    assert report.iqm([3.0]) == pytest.approx(3.0)


def test_iqm_interval_matches_a_percentile_bootstrap_over_seeds():
    # one task: rliable's stratified bootstrap resamples the seeds, as this plain numpy one does
    values = np.array([0.0, 1.0, 2.0, 5.0, 9.0, 10.0, 11.0, 30.0, 31.0, 40.0])
    rng = np.random.default_rng(1)
    resampled = values[rng.integers(0, len(values), size=(200_000, len(values)))]  # numpy's: near exact, cheap
    expected_low, expected_high = np.percentile(trim_mean(resampled, 0.25, axis=1), [2.5, 97.5])
    estimate, low, high = report.iqm_interval(values, resamples=5000)  # rliable loops in Python: ~2 s
    assert estimate == pytest.approx(trim_mean(values, 0.25))
    assert (low, high) == pytest.approx((expected_low, expected_high), abs=0.6)  # bootstrap noise of the two
    # a fixed random state
    assert report.iqm_interval(values, resamples=2000) == report.iqm_interval(values, resamples=2000)
    assert report.iqm_interval(np.array([2.0, 2.0, 2.0]))[1:] == pytest.approx((2.0, 2.0))


def test_iqm_interval_of_curves_is_per_point():
    curves = np.array([[0.0, 10.0], [1.0, 11.0], [2.0, 12.0], [3.0, 13.0]])
    estimate, low, high = report.iqm_interval(curves)
    np.testing.assert_allclose(estimate, [1.5, 11.5])
    assert np.all(low <= estimate) and np.all(estimate <= high) and np.all(high - low > 0)
    np.testing.assert_allclose(high - low, (high - low)[0])  # the same seeds shifted by 10: the same width


def test_pooled_stability_weights_seeds_by_their_evaluations_after_the_target():
    seeds = [{"stability": 1.0, "evaluations_after_target": 3}, {"stability": 0.0, "evaluations_after_target": 1},
             {"stability": None, "evaluations_after_target": None}, {"stability": None, "evaluations_after_target": 0}]
    assert report.pooled_stability(seeds) == pytest.approx(0.75)
    assert report.pooled_stability(seeds[2:]) is None


def test_hydra_and_vmapped_seeds_of_the_same_overrides_form_one_configuration(tmp_path):
    common = ["algo=dqn", "env=cartpole", "num_seeds=2"]
    write_run(tmp_path / "0", [*common, "seed=0", "hydra.job.chdir=false"], [1.0, 2.0])
    write_run(tmp_path / "1", ["seed=1", *reversed(common)], [3.0, 4.0])
    write_run(tmp_path / "2", [*common, "algo.learning_rate=0.1", "seed=0"], [5.0, 6.0])
    write_run(tmp_path / "3", ["seed=3"], [7.0])
    runs, skipped = report.load_runs(tmp_path)
    groups = report.group_runs(runs)
    assert skipped == []
    assert {key: len(group) for key, group in groups.items()} == {
        "algo=dqn env=cartpole num_seeds=2": 2, "algo.learning_rate=0.1 algo=dqn env=cartpole num_seeds=2": 1,
        "dqn on cartpole": 1}
    row = report.aggregate_row(groups["algo=dqn env=cartpole num_seeds=2"])
    assert (row["runs"], row["seeds"], row["mean_return"]) == (2, 4, pytest.approx(2.5))


def test_solved_fraction_and_medians_over_the_solved_seeds(tmp_path):
    write_run(tmp_path / "0", ["seed=0"], [1.0, 0.2], solved_steps=[100, None], solved_seconds=[4.0, None],
              steps_per_second=1000.0, target_return=1.0)
    write_run(tmp_path / "1", ["seed=1"], [1.0, 1.0], solved_steps=[300, 200], solved_seconds=[9.0, 6.0],
              steps_per_second=3000.0, target_return=1.0)
    runs, _ = report.load_runs(tmp_path)
    row = report.aggregate_row(runs)
    assert row["solved_fraction"] == pytest.approx(0.75)
    assert row["median_steps_to_solve"] == pytest.approx(200)
    assert row["median_seconds_to_solve"] == pytest.approx(6.0)
    assert row["env_steps_per_second"] == pytest.approx(2000.0)
    assert report.format_cells("x", row)[6:] == ["0.75 (3/4)", "-", "200", "6.0", "2,000"]


def test_without_a_target_solve_columns_are_dashes(tmp_path):
    write_run(tmp_path / "0", [], [1.0, 2.0])
    runs, _ = report.load_runs(tmp_path)
    assert report.format_cells("x", report.aggregate_row(runs))[6:10] == ["-", "-", "-", "-"]


def test_curves_of_different_schedules_meet_on_the_union_grid(tmp_path):
    write_run(tmp_path / "0", ["seed=0"], [2.0], eval_steps=(100, 200, 300))
    write_run(tmp_path / "1", ["seed=1"], [4.0], eval_steps=(100, 200))  # stopped early
    runs, _ = report.load_runs(tmp_path)
    steps, per_seed = report.configuration_curve(runs)
    assert steps.tolist() == [100, 200, 300]
    np.testing.assert_allclose(per_seed, [[2 / 3, 4 / 3, 2.0], [2.0, 4.0, 4.0]])


def test_main_writes_report_and_plot_and_skips_unfinished_runs(tmp_path, capsys):
    write_run(tmp_path / "sweep" / "0", ["algo=dqn", "seed=0"], [1.0, 3.0], target_return=2.0)
    write_run(tmp_path / "sweep" / "1", ["algo=dqn", "seed=1"], [5.0, 7.0], target_return=2.0, solved_steps=[100, 200])
    write_run(tmp_path / "sweep" / "2", ["algo=dqn", "seed=2"], [0.0], summary=False)
    assert report.main([str(tmp_path / "sweep"), "--output", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr()
    assert "configuration" in printed.out and "dqn on cartpole" in printed.out
    assert "skipped" in printed.err
    text = (tmp_path / "out" / "report.md").read_text()
    assert "Read 2 runs (4 seeds) in 1 configurations" in text and "skipped 1: 2 (no summary.json" in text
    assert markdown_rows(text)["dqn on cartpole"][1:4] == ["2", "4", "4.000"]
    assert (tmp_path / "out" / "learning_curves.png").read_bytes().startswith(b"\x89PNG")


@pytest.mark.parametrize("make_path", [lambda tmp: tmp / "missing", lambda tmp: tmp])
def test_a_missing_or_empty_path_exits_2_with_one_line(tmp_path, make_path):
    result = run_report(make_path(tmp_path))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and str(tmp_path) in result.stderr


def test_report_on_a_real_multirun(tmp_path):
    sweep = tmp_path / "sweep"
    overrides = ["algo=tabular_q", "env=gridworld", "algo.learning_rate=0.1,0.5", "seed=0,1", "num_seeds=2",
                 "total_env_steps=3000", "eval_every=1000", "log_every=1000", "eval_episodes=4", "target_return=1.0",
                 "progress=false", f"hydra.sweep.dir={sweep}"]
    result = subprocess.run([sys.executable, str(ROOT / "run.py"), "-m", *overrides], cwd=ROOT,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    jobs = sorted(path for path in sweep.iterdir() if path.is_dir())
    assert [job.name for job in jobs] == ["0", "1", "2", "3"]

    result = run_report(sweep)
    assert result.returncode == 0, result.stderr
    rows = markdown_rows((sweep / "report.md").read_text())
    for rate in ("0.1", "0.5"):
        seeds = [seed for job in jobs if f"algo.learning_rate={rate}" in (job / ".hydra" / "overrides.yaml").read_text()
                 for seed in json.loads((job / "summary.json").read_text())["seeds"]]
        solved = sum(seed["solved_at_env_steps"] is not None for seed in seeds)
        mean = np.mean([seed["final_eval_return"] for seed in seeds])
        row = rows[f"algo.learning_rate={rate}"]
        assert row[1:4] == ["2", "4", f"{mean:.3f}"]
        assert row[6] == f"{solved / 4:.2f} ({solved}/4)"
    png = (sweep / "learning_curves.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000
