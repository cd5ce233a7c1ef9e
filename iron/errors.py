"""The exception types of iron, one per layer, so callers can catch exactly what they mean.

Every message names the object, shows the bad value, states the rule and, where it can, says
how to fix it.
"""


class IronError(Exception):
    """Base of every error iron raises on purpose."""


class FieldError(IronError, TypeError):
    """An operator was given a field it does not have, or a field of the wrong kind."""


class ShapeError(IronError, ValueError):
    """A step's inputs do not have the shapes or dtypes its operator needs."""


class ResolveError(IronError, ValueError):
    """A tunable value (from a call, a profile entry or a default) breaks a device rule."""


class ProfileError(IronError, ValueError):
    """A profile entry or profile file is malformed, ambiguous or names unknown things."""


class DeviceError(IronError, ValueError):
    """An unknown device, or a device whose toolchain is missing on this machine."""


class CompileError(IronError, RuntimeError):
    """The target's compiler rejected an operator instance's kernel."""


class CheckpointError(IronError, ValueError):
    """A model checkpoint does not have the layout its configuration implies."""


class BundleError(IronError, ValueError):
    """A model bundle is missing, incomplete or damaged."""


class FormatError(IronError, ValueError):
    """A weight format, group size or byte array that does not fit together (``iron.quant``)."""
