"""iron: a batch compiler for neural-network operator graphs, in the style of AMD's IRON.

A model is an ``iron.Graph`` whose ``body`` calls operators' ``step``; each step is resolved
(call keyword > profile entry > ``Operator.resolve``), compiled once per distinct instance into
a cached artifact, and run on the graph's device.
"""

from . import operators
from .devices import Device, device
from .errors import (BundleError, CheckpointError, CompileError, DeviceError, FieldError,
                     IronError, ProfileError, ResolveError, ShapeError)
from .graph import Graph
from .operator import Operator, param, tunable
from .profile import Profile
from .program import Program, Step
from .tensor import Tensor, TensorSpec, bfloat16, spec

__all__ = ["BundleError", "CheckpointError", "CompileError", "Device", "DeviceError",
           "FieldError", "Graph", "IronError", "Operator", "Profile", "ProfileError", "Program",
           "ResolveError", "ShapeError", "Step", "Tensor", "TensorSpec", "bfloat16", "device",
           "operators", "param", "spec", "tunable"]
