"""Mutation testing of the small pure modules the results rest on: each module against its own focused tests.

    python bench/mutation.py                      # every module below, one after another
    python bench/mutation.py targets nstep        # some of them
    python bench/mutation.py --report             # the table again, from the last run's records

mutmut 3 (`pip install mutmut`) mutates one module at a time in a fresh copy of the repository under
.mutation/<module>/ and runs, for each mutant, the tests of that module's focused file that call the mutated
function, with one worker (mutmut maps a test to the functions called while it runs: what a module-scoped
fixture calls counts for its first test only). The settings every module shares are pyproject.toml's
[tool.mutmut]; this script overrides only the module to mutate and the test file. A table (module, mutants,
killed, survived, score) goes to stdout, progress to stderr. Mutants judged equivalent (no test can tell them
from the original; the reason beside each in EQUIVALENT) are counted apart: the score is killed over the
non-equivalent ones. To read a survivor: `cd .mutation/<module> && mutmut show <name>`.
Not a test: pytest does not collect it and CI does not run it. On 2026-12-02 on the shared 2-core VM (two
modules at a time, other jobs running) the 828 mutants took ~62 minutes: targets 9, nstep 8, exploration 10,
protocol 6, prioritized_replay 23 (each mutant is a fresh pytest process that imports JAX and compiles).
On 2026-12-05 (one module at a time, the same VM, another job running) R2D2's sequence_targets took 4.0 minutes
for 204 mutants and sequence_replay 6.4 for 255; on 2026-12-06 D4PG's distributional 0.8 for 41 and (later,
nothing else running) continuous_actions 5.8 for 133; on 2026-12-07 PPO's advantages 1.4 for 54 and
policy_losses 1.0 for 51.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

from shared import REPO_ROOT, print_table

# module name -> (file to mutate, its focused tests as pytest arguments)
MODULES = {
    "targets": ("algorithms/common/targets.py", ["tests/test_targets.py"]),
    "nstep": ("algorithms/common/nstep.py", ["tests/test_nstep.py"]),
    # without the million-update drift test (~10 CPU seconds a mutant): the exact tests against Flashbax's
    # writes and the node sums catch the same mutants of the tree's writes
    "prioritized_replay": ("algorithms/common/prioritized_replay.py",
                           ["tests/test_prioritized_replay.py", "-k", "not million"]),
    "exploration": ("algorithms/common/exploration.py", ["tests/test_exploration.py"]),
    # the unit tests only: the rest of the file trains a short run in a subprocess
    "protocol": ("framework/run/protocol.py",
                 ["tests/test_protocol.py", "-k",
                  "not (final_evaluation_plays or saved_best_policy_reproduces or log_shows_the_headline)"]),
    "sequence_targets": ("algorithms/common/sequence_targets.py", ["tests/test_sequence_targets.py"]),
    # the replay's tests only: the rest of the file builds and trains an R2D2 network
    "sequence_replay": ("algorithms/common/sequence_replay.py",
                        ["tests/test_r2d2.py", "-k", "drawable or a_draw_gathers or replay"]),
    # D4PG's categorical projection and n-step target; the rest of the file builds and runs D4PG
    "distributional": ("algorithms/common/distributional.py",
                       ["tests/test_d4pg.py", "-k", "projection or n_step_target"]),
    # D4PG's bounds and exploration noise: the unit tests only (the rest of the file builds and runs D4PG)
    "continuous_actions": ("algorithms/common/continuous_actions.py",
                           ["tests/test_d4pg.py", "-k", "bounds or sigma_ladder_is or ornstein_uhlenbeck_noise "
                            "or gaussian_noise_forgets or noise_moves"]),
    # PPO's GAE and advantage normalisation, and its losses: the unit tests only (the rest of the file builds and
    # runs PPO)
    "advantages": ("algorithms/common/advantages.py", ["tests/test_ppo.py", "-k", "gae or normalized_advantages"]),
    "policy_losses": ("algorithms/common/policy_losses.py",
                      ["tests/test_ppo.py", "-k",
                       "surrogate or value_error or masked_mean or approx_kl or clip_range"]),
}

# mutant name -> why no test can tell it from the original (names as mutmut 3.8 numbers them in today's code)
CLAMPED = "indexes a size-1 axis at 1; JAX clamps an out-of-bounds index to the last element, the same one"
ARANGE_INT = "powers of an int32 arange instead of a float32 one: discount ** k is the same float32 either way"
TAKE_AXIS = "take_along_axis's axis defaults to -1: dropping axis=-1 changes nothing"
LINSPACE_DTYPE = "linspace without dtype=float32: with x64 off (JAX's default and the project's) it is float32 anyway"
HUBER_EDGE = "< instead of <= at |error| = delta, where both branches give delta^2 / 2"
TD_AXIS = "axis=+1 instead of -1 on Q(s) [batch, actions], 2-D by td_errors' own [:, None] indexing: the same axis"
EQUIVALENT: dict[str, str] = {f"algorithms.common.targets.x_{name}": why for name, why in {
    "n_step_transition__mutmut_20": ARANGE_INT, "n_step_transition__mutmut_22": ARANGE_INT,
    "n_step_transition__mutmut_65": CLAMPED, "n_step_transition__mutmut_74": CLAMPED,
    "q_targets__mutmut_18": TAKE_AXIS, "q_targets__mutmut_21": CLAMPED, "huber__mutmut_10": HUBER_EDGE,
    "td_errors__mutmut_14": TAKE_AXIS, "td_errors__mutmut_17": TD_AXIS, "td_errors__mutmut_19": CLAMPED,
}.items()} | {f"algorithms.common.nstep.x_{name}": why for name, why in {
    "push__mutmut_6": "concatenate without axis=0: its default axis is 0",
    "empty_window__mutmut_40": "the rewards' zeros as per_env(None): jnp.zeros' default dtype is float32",
    "oldest_transition__mutmut_39": "valid.astype(None) instead of float32: astype(None) is the default float, float32",
}.items()} | {
    # mutmut names a method x<U+01C1>Class<U+01C1>method
    "framework.run.protocol.x\u01c1BestPolicies\u01c1keep__mutmut_8": "reshape's -1 as -2: numpy 2 takes any negative "
                                                                 "size as the one it infers",
} | {f"algorithms.common.exploration.x_{name}": why for name, why in {
    "greedy_with_random_ties__mutmut_15": "the tie's rank as float32 (astype(None)) instead of int32: a whole "
                                          "number that compares with the counts of maxima the same way",
    "epsilon_greedy__mutmut_31": "the random action clamped at num_actions + 1 instead of - 1: u < epsilon makes "
                                 "u / epsilon < 1 in float32 (checked on 2M epsilons), so the clamp never acts",
    "actor_epsilons__mutmut_13": "asarray(epsilon, None) instead of float32: a Python float becomes float32 anyway",
    "actor_epsilons__mutmut_15": "asarray(epsilon) without float32: a Python float becomes float32 anyway",
    "rollout_draws__mutmut_8": "random.bits(..., None) instead of uint32: its default dtype is uint32",
    "rollout_draws__mutmut_11": "random.bits without uint32: its default dtype is uint32",
}.items()} | {f"algorithms.common.prioritized_replay.x_{name}": why for name, why in {
    # only Flashbax's own sampler and writes read these, and this module calls neither (only buffer.init)
    "make_prioritized_replay__mutmut_5": "Flashbax's sample_batch_size=None: only Flashbax's sampler reads it",
    "make_prioritized_replay__mutmut_17": "Flashbax's priority_exponent left at its default: only its writes read it",
    "make_prioritized_replay__mutmut_29": "priorities >= 0 instead of > 0: at 0 both branches store 0 ** alpha",
    "make_prioritized_replay__mutmut_105": "leaves >= 0 instead of > 0: at 0 both branches read 0 ** (1 / alpha)",
    # the walk's guard against 0 / 0 at an empty node: there the node's children are 0 too, so every variant gives 0
    "stratified_sample__mutmut_39": "value >= 0 instead of > 0 in the outer guard: at value 0 the ratio is 0 / 1 = 0",
    "stratified_sample__mutmut_48": "value >= 0 in the inner guard: at value 0 the 0 / 0 is discarded by the outer one",
    "stratified_sample__mutmut_50": "2.0 instead of 1.0 as the divisor the outer guard discards",
    "importance_weights__mutmut_18": "2.0 instead of 1.0 as the stand-in probability the outer where discards",
    "importance_weights__mutmut_26": "max(largest weight, 1.0) instead of 1e-30: with probabilities <= 1 and beta >= 0 "
                                     "every drawable weight is >= 1, and a batch of none divides 0 either way",
}.items()} | {f"algorithms.common.sequence_targets.x_{name}": why for name, why in {
    "n_step_targets__mutmut_14": "argmax's axis=+1 instead of -1 on Q [T, actions], 2-D by the [:, None] indexing",
    "n_step_targets__mutmut_23": TAKE_AXIS,
    "n_step_targets__mutmut_24": "take_along_axis's axis=+1 instead of -1 on Q [T, actions]: the same axis",
    "n_step_targets__mutmut_26": CLAMPED,
    "n_step_targets__mutmut_41": "ahead's fill in its own dtype (bool flags, float32 rewards and values): x's dtype",
    "n_step_targets__mutmut_44": "ahead's fill in its own dtype (bool flags, float32 rewards and values): x's dtype",
    # past the sequence's end (t + j >= T) a window is closed (its last step came at t + j - 1): no one reads the fill
    "n_step_targets__mutmut_69": "terminated's fill past the end True: read only under open_, False there",
    "n_step_targets__mutmut_76": "ends' fill past the end False: read only under open_, False there",
    "n_step_targets__mutmut_87": "the reward's fill past the end 1.0: multiplied by open_, False there",
    "n_step_targets__mutmut_115": "the value's fill past the end 1.0: read only by the last step's target, which has "
                                  "valid 0 (its loss and priority weight it 0)",
    "n_step_targets__mutmut_138": "valid.astype(None) instead of float32: astype(None) is the default float, float32",
    "sequence_priority__mutmut_24": "count >= 0 instead of > 0: with no valid step the mix itself is "
                                    "eta 0 + (1 - eta) 0 / max(0, 1) = 0",
}.items()} | {f"algorithms.common.sequence_replay.x_{name}": why for name, why in {
    "make_sequence_replay__mutmut_60": "priorities >= 0 instead of > 0: at 0 both branches store 0 ** alpha",
    "make_sequence_replay__mutmut_104": "new slots from write + 1 + k period: write is a multiple of the period, so "
                                        "it floors to the same slot",
    "make_sequence_replay__mutmut_200": "env clamped at num_envs + 1 instead of - 1: only a padding leaf has env "
                                        "num_envs, and JAX clamps that out-of-bounds gather index to num_envs - 1",
    "make_sequence_replay__mutmut_241": "leaves >= 0 instead of > 0: at 0 both branches read 0 ** (1 / alpha)",
}.items()} | {f"algorithms.common.distributional.x_{name}": why for name, why in {
    "atoms__mutmut_4": LINSPACE_DTYPE,
    "atoms__mutmut_8": LINSPACE_DTYPE,
}.items()} | {
    "algorithms.common.advantages.x_gae__mutmut_33": "the scan's zero carry as zeros_like(deltas[1]) instead of [0]: "
                                                     "every row has the first's shape and dtype (and JAX clamps the "
                                                     "[1] of a one-step block to its last row)",
}

# what the fork server imports once, so that each mutant's process starts with them: the libraries and the
# repository's modules (conftest's load_plugins); importing them starts no JAX backend, so the fork stays safe
PRELOAD = ["numpy", "jax", "jax.numpy", "flax.linen", "flax.struct", "flashbax", "optax", "pytest", "xdist.plugin",
           "framework.core.registry", "framework.core.config", "framework.anakin.trainer",
           "framework.anakin.evaluation", "framework.run.policy",
           "framework.run.protocol", "algorithms.common.targets", "algorithms.common.nstep",
           "algorithms.common.prioritized_replay", "algorithms.common.exploration",
           "algorithms.common.sequence_targets", "algorithms.common.sequence_replay",
           "algorithms.common.distributional", "algorithms.common.continuous_actions",
           "algorithms.common.advantages", "algorithms.common.policy_losses", "envs", "algorithms"]
# every mutant's process compiles the tests' unchanged XLA programs again: a disk cache shared by all keeps
# that to a read (the cache key is the program, so a mutated program compiles afresh)
JAX_CACHE = {"JAX_COMPILATION_CACHE_DIR": str(REPO_ROOT / ".mutation" / "jax_cache"),
             "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0", "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}
# tests/forkserver.py: conftest imports it (its server starts in xdist workers only, so never in a mutant's run)
COPIED = ["algorithms", "framework", "envs", "conf", "run.py", "tests/conftest.py", "tests/forkserver.py"]

# mutmut's verdicts by worker exit code (mutmut.stats.status_by_exit_code, 3.8)
KILLED_CODES, SURVIVED_CODES = {1, 3}, {0}
TIMEOUT_CODES, NO_TEST_CODES = {36, -24, 24, 152, 255}, {5, 33}


def mutmut_section(module_file: str, tests: list[str]) -> str:
    """pyproject's [tool.mutmut] with this module and its tests, and the fork server's preload list."""
    settings = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["mutmut"]
    settings.update(only_mutate=[module_file], pytest_add_cli_args_test_selection=tests,
                    forkserver_warmup="import", preload_modules_file="preload.txt")
    # JSON strings, numbers, booleans and lists of them are TOML values as written
    return "[tool.mutmut]\n" + "".join(f"{key} = {json.dumps(value)}\n" for key, value in settings.items())


def without_mutmut_section(pyproject: str) -> str:
    """pyproject.toml's text without its [tool.mutmut] table (up to the next table header)."""
    return re.sub(r"(?ms)^\[tool\.mutmut\]\n.*?(?=^\[|\Z)", "", pyproject)


def prepare(name: str) -> Path:
    module_file, tests = MODULES[name]
    work = REPO_ROOT / ".mutation" / name
    shutil.rmtree(work, ignore_errors=True)
    (work / "tests").mkdir(parents=True)
    for path in COPIED + [t for t in tests if t.startswith("tests/")]:
        source = REPO_ROOT / path
        if source.is_dir():
            shutil.copytree(source, work / path, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, work / path)
    pyproject = without_mutmut_section((REPO_ROOT / "pyproject.toml").read_text()).rstrip() + "\n\n"
    (work / "pyproject.toml").write_text(pyproject + mutmut_section(module_file, tests))
    assert tomllib.loads((work / "pyproject.toml").read_text())["tool"]["mutmut"]["only_mutate"] == [module_file]
    (work / "preload.txt").write_text("\n".join(PRELOAD) + "\n")
    return work


def verdicts(work: Path, module_file: str) -> dict[str, int]:
    """Exit code of every mutant of the module, from mutmut's record of the run."""
    meta = json.loads((work / "mutants" / (module_file + ".meta")).read_text())
    return meta["exit_code_by_key"]


def run_module(name: str, report_only: bool = False) -> dict:
    module_file, _ = MODULES[name]
    work = REPO_ROOT / ".mutation" / name
    seconds = float("nan")
    if not report_only:
        work = prepare(name)
        print(f"[{name}] mutmut run in {work}", file=sys.stderr, flush=True)
        start = time.time()
        # progress and mutmut's own summary go to stderr; the table is this script's stdout
        result = subprocess.run([sys.executable, "-m", "mutmut", "run", "--max-children", "1"], cwd=work,
                                stdout=sys.stderr, env={**os.environ, "JAX_PLATFORMS": "cpu", **JAX_CACHE})
        seconds = time.time() - start
        if result.returncode != 0:
            raise SystemExit(f"[{name}] mutmut run failed with exit status {result.returncode}")
    codes = verdicts(work, module_file)
    equivalent = {key for key in codes if key in EQUIVALENT}
    counted = {key: code for key, code in codes.items() if key not in equivalent}
    survivors = sorted(key for key, code in counted.items() if code in SURVIVED_CODES)
    other = sorted(key for key, code in counted.items() if code not in KILLED_CODES | SURVIVED_CODES)
    killed = sum(code in KILLED_CODES for code in counted.values())
    for key in survivors:
        print(f"[{name}] survived: {key}", file=sys.stderr)
    for key in other:
        print(f"[{name}] not killed, not survived (exit {codes[key]}): {key}", file=sys.stderr)
    return {"module": module_file, "mutants": len(codes), "equivalent": len(equivalent), "killed": killed,
            "survived": len(survivors), "other": len(other), "seconds": seconds, "survivors": survivors + other}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("modules", nargs="*", help=f"some of {', '.join(MODULES)} (default: all)")
    parser.add_argument("--report", action="store_true",
                        help="no run: the table from the verdicts in .mutation/ (e.g. after `mutmut run NAMES` there)")
    args = parser.parse_args()
    unknown = set(args.modules) - set(MODULES)
    if unknown:
        parser.error(f"unknown module(s) {sorted(unknown)}; known: {', '.join(MODULES)}")
    rows = [run_module(name, args.report) for name in args.modules or MODULES]
    header = ("module", "mutants", "equivalent", "killed", "survived", "timeout/other", "score", "minutes")
    table = [(r["module"], r["mutants"], r["equivalent"], r["killed"], r["survived"], r["other"],
              f"{r['killed'] / max(r['mutants'] - r['equivalent'], 1):.1%}",
              "-" if args.report else f"{r['seconds'] / 60:.1f}") for r in rows]
    print_table("Mutation score: killed / non-equivalent mutants (mutmut, each module against its focused tests)",
                header, table)
    for row in rows:
        for key in row["survivors"]:
            print(f"not killed: {key}")


if __name__ == "__main__":
    main()
