"""Static plots written into the run dir (matplotlib's Agg backend: no display needed)."""
from pathlib import Path
from typing import Optional, Sequence

import numpy as np


def _pyplot():
    """matplotlib.pyplot on the Agg backend, imported on first use: ~0.4 s that a run's start need not pay."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_learning_curve(env_steps: Sequence[int], returns_per_seed: np.ndarray, path: Path,
                        target_return: Optional[float] = None, title: str = "") -> None:
    """Evaluation return per seed (thin) and their mean (bold) against env steps."""
    returns_per_seed = np.asarray(returns_per_seed, dtype=float).reshape(len(env_steps), -1)
    plt = _pyplot()
    figure, axes = plt.subplots(figsize=(7, 4))
    if returns_per_seed.shape[1] > 1:
        axes.plot(env_steps, returns_per_seed, color="tab:blue", alpha=0.25, linewidth=0.8)
    axes.plot(env_steps, returns_per_seed.mean(axis=1), color="tab:blue", linewidth=2, label="mean over seeds")
    if target_return is not None:
        axes.axhline(target_return, color="tab:red", linestyle="--", linewidth=1, label="target")
    axes.set(xlabel="env steps per seed", ylabel="greedy evaluation return", title=title)
    axes.legend(loc="lower right")
    axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=100, metadata={"Title": title})  # the PNG's own title too: readable without pixels
    plt.close(figure)
