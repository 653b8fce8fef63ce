"""The contracts: Algorithm and its actor and learner parts, Environment and the host env contract, the registry,
the config schema, errors, the keys a run draws from, devices. Imports nothing else of the project."""
