"""actors=ray: the actor slots of a host run in Ray actor processes; the cluster they join or a local head."""
