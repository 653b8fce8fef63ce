"""lightspeed's framework, one sub-package per room:

    core/      the contracts (algorithm, env, host env, registry, config, errors, keys, devices): imports nothing
               else of the project
    run/       what every run does whatever its shape: run dir, protocol, logging, checkpoints, policies
    anakin/    the single-program shape: a JAX env and the update compiled into one program per chunk
    sebulba/   the actors-and-learner shape: host envs on actor threads, or Ray actor processes (sebulba/ray/)
    tools/     evaluate and report, over finished runs
    app/       the command line: run.py and the `lightspeed` command

Installed as `lightspeed.framework` (lightspeed/__init__.py is the public face); the old top-level name
`framework` and its flat modules still import, with a DeprecationWarning (lightspeed/_old_names.py).
"""

if __name__ == "framework":  # its old top-level name, from a source checkout: lightspeed's module, not a second copy
    from lightspeed._old_names import become_lightspeeds

    become_lightspeeds(__name__)
