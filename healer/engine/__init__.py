"""The pure core: evaluation, lifecycle and safety. No I/O, no clock: ``now`` is a parameter."""
