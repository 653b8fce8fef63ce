"""The actors-and-learner shape (Sebulba): actor threads (or Ray actor processes, in `ray/`) step host envs and send
blocks through a bounded queue to one learner, paced by a rate limiter, fed parameters by a parameter store."""
