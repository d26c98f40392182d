"""kvgate's system under test: the offloading manager, its policies, the copy worker and the
scheduler driver."""

# One folder, one name (kvgate/__init__.py): under any other name its modules would be loaded a
# second time, as a second copy of every class in them.
if __name__ != "kvgate.impl":
    raise ImportError(f"this folder is kvgate.impl; {__name__!r} is not its name")
