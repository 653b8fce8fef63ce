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


def plot_grid_values(values: np.ndarray, path: Path, walls: np.ndarray, path_cells: Sequence[tuple[int, int]],
                     start: Sequence[int], goal: Sequence[int], title: str = "",
                     other_paths: Sequence[Sequence[tuple[int, int]]] = ()) -> None:
    """A heatmap of a value per grid cell, walls in black, a path drawn bold from start to goal and
    `other_paths` thin under it."""
    plt = _pyplot()
    shown = np.ma.masked_where(walls, values)
    colormap = plt.colormaps["viridis"].with_extremes(bad="black")
    height, width = values.shape
    figure, axes = plt.subplots(figsize=(max(4, width * 0.6), max(3, height * 0.6)))
    image = axes.imshow(shown, cmap=colormap)
    figure.colorbar(image, ax=axes, label="max Q")
    for other in other_paths:
        if len(other) > 1:
            rows, cols = zip(*other, strict=True)
            axes.plot(cols, rows, color="white", linewidth=0.8, alpha=0.4)
    if len(path_cells) > 1:
        rows, cols = zip(*path_cells, strict=True)
        axes.plot(cols, rows, color="white", linewidth=2, marker="o", markersize=3)
    axes.text(start[1], start[0], "S", ha="center", va="center", color="red", fontweight="bold")
    axes.text(goal[1], goal[0], "G", ha="center", va="center", color="red", fontweight="bold")
    axes.set(title=title, xticks=range(width), yticks=range(height))
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
