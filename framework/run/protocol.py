"""What a run's result is: its evaluation history, the sustained-solve rule, each seed's best policy.

- Periodic evaluations (`eval_episodes` greedy episodes every `eval_every` env steps) draw the
  learning curve. A seed is *solved* once `solve_window` consecutive periodic evaluations are all
  >= `target_return`; `solved_at_env_steps` names the last evaluation of that window.
- Each seed's best policy is its policy at its best periodic evaluation (ties: the later one).
- Stability: the fraction of a seed's periodic evaluations after its first one >= target that
  are still >= target.
- The result is a final evaluation (`final_eval_episodes` episodes) of the policy the run ends
  with; the best policy gets the same episodes beside it. With a target, a seed's run ends once it is
  solved, with its best policy so far (early stopping that restores the best weights).
"""
from typing import Any, Optional

import jax
import numpy as np

SOLVE_RULE = ("solved_at_env_steps: env steps of the last of `solve_window` consecutive periodic evaluations "
              ">= target_return")


class EvaluationHistory:
    """Per-seed periodic evaluations, and what follows from them: solves, bests, stability."""

    def __init__(self, num_seeds: int, target_return: Optional[float], solve_window: int):
        self.target, self.window = target_return, solve_window
        self.env_steps: list[int] = []
        self.returns: list[list[float]] = []  # [evaluation][seed]
        self.solved_at_env_steps: list[Optional[int]] = [None] * num_seeds
        self.solved_at_seconds: list[Optional[float]] = [None] * num_seeds
        self.best_eval_return: list[Optional[float]] = [None] * num_seeds
        self.best_at_env_steps: list[Optional[int]] = [None] * num_seeds

    def record(self, env_steps: int, returns: np.ndarray, seconds: float) -> np.ndarray:
        """Add one evaluation; returns which seeds' best policy it is now (ties count: the later one)."""
        self.env_steps.append(env_steps)
        self.returns.append([float(r) for r in returns])
        improved = np.array([best is None or value >= best
                             for value, best in zip(self.returns[-1], self.best_eval_return, strict=True)])
        for seed in np.flatnonzero(improved):
            self.best_eval_return[seed], self.best_at_env_steps[seed] = self.returns[-1][seed], env_steps
        if self.target is not None and len(self.returns) >= self.window:
            recent = np.array(self.returns[-self.window:]) >= self.target  # [window, seed]
            for seed in np.flatnonzero(recent.all(axis=0)):
                if self.solved_at_env_steps[seed] is None:
                    self.solved_at_env_steps[seed], self.solved_at_seconds[seed] = env_steps, seconds
        return improved

    @property
    def all_solved(self) -> bool:
        return self.target is not None and all(s is not None for s in self.solved_at_env_steps)

    def after_first_hit(self, seed: int) -> Optional[np.ndarray]:
        """The seed's evaluations strictly after its first one >= target (None: no target, or never reached)."""
        if self.target is None:
            return None
        returns = np.array([evaluation[seed] for evaluation in self.returns])
        hits = np.flatnonzero(returns >= self.target)
        return returns[hits[0] + 1:] if len(hits) else None

    def stability(self, seed: int) -> Optional[float]:
        later = self.after_first_hit(seed)
        return None if later is None or len(later) == 0 else float(np.mean(later >= self.target))

    def to_dict(self) -> dict:
        keys = ("env_steps", "returns", "solved_at_env_steps", "solved_at_seconds", "best_eval_return",
                "best_at_env_steps")
        return {key: getattr(self, key) for key in keys}

    def load(self, saved: dict) -> None:
        for key, value in saved.items():
            setattr(self, key, list(value))


class BestPolicies:
    """Every seed's best policy so far, in host memory, laid out as the run's policies are
    ([seed, ...], or [device, seed, ...] for learner-parallel runs)."""

    def __init__(self, policies: Any, seed_axis: int):
        self.policies, self.seed_axis = policies, seed_axis

    def keep(self, improved: np.ndarray, policies: Any) -> None:
        """Take the seeds in `improved` from `policies` (host arrays of the same layout)."""
        def select(new: np.ndarray, old: np.ndarray) -> np.ndarray:
            mask = improved.reshape((1,) * self.seed_axis + (-1,) + (1,) * (new.ndim - self.seed_axis - 1))
            return np.where(mask, new, old)

        self.policies = jax.tree.map(select, policies, self.policies)


def seed_results(history: EvaluationHistory, final_returns: np.ndarray, best_policy_returns: np.ndarray) -> list[dict]:
    """summary.json's row per seed: the final evaluation of its final and best policies and its history's verdicts."""
    rows = []
    for seed, (final, best) in enumerate(zip(final_returns, best_policy_returns, strict=True)):
        later = history.after_first_hit(seed)
        rows.append({
            "seed_index": seed,
            "final_eval_return": float(np.mean(final)),
            "final_eval_std": float(np.std(final)),
            "best_policy_eval_return": float(np.mean(best)),
            "best_eval_return": history.best_eval_return[seed],
            "best_at_env_steps": history.best_at_env_steps[seed],
            "solved_at_env_steps": history.solved_at_env_steps[seed],
            "solved_at_seconds": history.solved_at_seconds[seed],
            "stability": history.stability(seed),
            "evaluations_after_target": None if later is None else len(later),
        })
    return rows
