"""Built-in algorithms; importing this package registers them."""
from algorithms import apex, dqn, tabular_q  # noqa: F401  (registration)
