"""iron: a batch compiler for neural-network operator graphs, in the style of AMD's IRON.

A model is an ``iron.Graph`` whose ``body`` calls operators' ``step``; each step is resolved
(call keyword > profile entry > the default ``iron.resolve`` chooses), compiled once per
distinct instance into a cached artifact, and run on the graph's device.

The names below are imported on first use, so that a tool needing only a light part of iron
(``dodo.py`` on a no-op build) does not pay for numpy and every operator.
"""

import importlib

_EXPORTS = {
    "operators": ".operators", "Device": ".devices", "device": ".devices",
    "BundleError": ".errors", "CheckpointError": ".errors", "CompileError": ".errors",
    "DeviceError": ".errors", "FieldError": ".errors", "IronError": ".errors",
    "ProfileError": ".errors", "ResolveError": ".errors", "ShapeError": ".errors",
    "Graph": ".graph", "Program": ".program", "Step": ".program", "Operator": ".operator",
    "resolve": ".resolution", "legal_settings": ".resolution",
    "param": ".operator", "tunable": ".operator", "Profile": ".profile", "Tensor": ".tensor",
    "TensorSpec": ".tensor", "bfloat16": ".tensor", "spec": ".tensor",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'iron' has no attribute {name!r}")
    value = importlib.import_module(module, __name__)
    if name != "operators":
        value = getattr(value, name)
    globals()[name] = value
    return value
