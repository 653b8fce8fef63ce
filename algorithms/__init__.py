"""Built-in algorithms; importing this package registers them."""
from lightspeed.algorithms import apex, d4pg, dqn, ppo, r2d2, tabular_q  # noqa: F401  (registration)

if __name__ == "algorithms":  # its old top-level name, from a source checkout: lightspeed's module, not a
    # second copy (what ran above, in the module given up, imported lightspeed's own)
    from lightspeed._old_names import become_lightspeeds

    become_lightspeeds(__name__)
