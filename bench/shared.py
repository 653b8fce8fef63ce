"""What the bench scripts share: tables, rates, and a timed `run.py` launch."""
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional, Sequence

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
        rest = [str(cell).rjust(width) for cell, width in zip(cells[1:], widths[1:])]
        return "  ".join([first, *rest])

    print(f"\n{title}")
    print(line(header))
    print("  ".join("-" * width for width in widths))
    for row in rows:
        print(line(row))
    sys.stdout.flush()


def run_to_solve(*overrides: str, compilation_cache: Optional[str] = None) -> dict:
    """`python run.py OVERRIDES`: its summary and process seconds. Without `compilation_cache` a
    cold start, whose compilation counts as it does for the references."""
    run_dir = Path(tempfile.mkdtemp(prefix="bench_run_"))
    args = [sys.executable, str(REPO_ROOT / "run.py"), *overrides, "progress=false", f"hydra.run.dir={run_dir}",
            f"compilation_cache={compilation_cache or 'null'}"]
    start = time.time()
    subprocess.run(args, cwd=REPO_ROOT, check=True, capture_output=True)
    wall = time.time() - start
    return {"summary": json.loads((run_dir / "summary.json").read_text()), "process_seconds": wall}


def solve_rows(label: str, result: dict) -> list[list[str]]:
    """One row for the run (all seeds: the slowest one counts) and one per seed."""
    seeds = result["summary"]["seeds"]
    solved = [s for s in seeds if s["solved_at_env_steps"] is not None]
    all_solved = len(solved) == len(seeds)
    rows = [[label, f"{len(solved)}/{len(seeds)}",
             format_value(max((s["solved_at_env_steps"] for s in solved), default=None)),
             format_value(max(s["solved_at_seconds"] for s in solved) if all_solved else None, ".1f"),
             f"{result['process_seconds']:.1f}", f"{result['summary']['compile_seconds']:.1f}"]]
    for s in seeds:
        rows.append([f"  seed {s['seed_index']}", "yes" if s["solved_at_env_steps"] is not None else "no",
                     format_value(s["solved_at_env_steps"]), format_value(s["solved_at_seconds"], ".1f"), "", ""])
    return rows


SOLVE_HEADER = ["run", "solved", "env steps to solve", "launch to solved [s]", "process [s]", "compile [s]"]


def cpu_model() -> str:
    try:
        for text_line in Path("/proc/cpuinfo").read_text().splitlines():
            if text_line.startswith("model name"):
                return text_line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def print_machine(title: str) -> None:
    import jax

    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(title)
    print(f"  date:    {datetime.datetime.now().astimezone().strftime('%Y-%m-%d %H:%M %Z')}")
    print(f"  cpu:     {cpu_model()}")
    print(f"  cores:   {os.cpu_count()} ({usable} usable by this process)")
    print(f"  jax:     {jax.__version__} on {jax.default_backend()}, {len(jax.devices())} device(s)")
    print(f"  python:  {platform.python_version()}")
    sys.stdout.flush()
