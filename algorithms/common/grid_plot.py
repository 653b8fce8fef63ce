"""Tabular agents' picture of a grid: a value per cell as a heatmap with the greedy paths drawn over it."""
from pathlib import Path
from typing import Sequence

import numpy as np


def plot_grid_values(values: np.ndarray, path: Path, walls: np.ndarray, path_cells: Sequence[tuple[int, int]],
                     start: Sequence[int], goal: Sequence[int], title: str = "",
                     other_paths: Sequence[Sequence[tuple[int, int]]] = ()) -> None:
    """A heatmap of a value per grid cell, walls in black, a path drawn bold from start to goal and
    `other_paths` thin under it."""
    import matplotlib  # on first use: ~0.4 s that a run's start need not pay

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

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
