"""What kvgate checks and how: the lockstep oracle, the state machines and their coverage labels,
targets and adapters, the catalogue of known-bad variants. The command line is ``kvgate.cli``."""
