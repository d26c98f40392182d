"""kvgate's reference model: the offloading manager's rule in plain Python (never imports impl/).

``admission_step`` is the admission rule as a pure function; ``Model`` is the whole manager.
"""
from kvgate.model.admission import admission_step
from kvgate.model.cache import Model, ModelError

__all__ = ["Model", "ModelError", "admission_step"]
