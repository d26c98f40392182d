"""What kvgate checks and how: the lockstep oracle, the state machines and their coverage labels,
targets and adapters, the catalogue of known-bad variants. The command line is ``kvgate.cli``."""

# One folder, one name (kvgate/__init__.py): under any other name its modules would be loaded a
# second time, as a second copy of every class in them.
if __name__ != "kvgate.properties":
    raise ImportError(f"this folder is kvgate.properties; {__name__!r} is not its name")
