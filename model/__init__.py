"""kvgate's reference model: the offloading manager's rule in plain Python (never imports impl/).

``admission_step`` is the admission rule as a pure function; ``Model`` is the whole manager.
"""

# One folder, one name (kvgate/__init__.py): under any other name its modules would be loaded a
# second time, as a second copy of every class in them.
if __name__ != "kvgate.model":
    raise ImportError(f"this folder is kvgate.model; {__name__!r} is not its name")

from kvgate.model.admission import admission_step
from kvgate.model.cache import Model, ModelError

__all__ = ["Model", "ModelError", "admission_step"]
