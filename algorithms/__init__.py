"""Built-in algorithms; importing this package registers them."""
from algorithms import apex, d4pg, dqn, ppo, r2d2, tabular_q  # noqa: F401  (registration)
