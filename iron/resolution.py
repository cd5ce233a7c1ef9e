"""Resolution: an operator instance's unset tunables filled for a device, and every rule checked.

Two parties state rules, and this module chains them:

- the operator, what it computes: ``Operator.rules(dev)`` holds for any device, in the
  device's figures (``dev.columns``), and never asks which kind of device it is;
- the device's target, what its kernels and designs need of each operator class:
  ``Target.rules(op, dev)`` (``iron/targets/<kind>/rules.py``, keyed by class; on an NPU
  followed by the check that the instance's design fits the device's resources).

A target's rules are asked only once the operator's own hold (a design can only be drawn for
a well-formed instance).  ``resolve`` fills unset tunables with the first combination of
``op.space(dev)`` that breaks no rule and raises ``ResolveError`` naming the first rule a
value breaks and where the value came from (the call, a profile entry, the default);
``legal_settings`` lists every legal combination (the tuner's sweep).
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Iterator, Mapping

from .devices import Device, device
from .errors import ResolveError
from .operator import Operator, Rule
from .targets import target_for

#: Where a tunable's value came from when resolution chose it, as error messages name it.
DEFAULT_SOURCE = "the default"


def rules(op: Operator, dev: Device) -> Iterator[Rule]:
    """The operator's own rules on ``dev``, then, when they all hold, its target's."""
    own = list(op.rules(dev))
    yield from own
    if all(r.ok for r in own):
        yield from target_for(dev).rules(op, dev)


def legal(op: Operator, dev: Device) -> bool:
    return all(r.ok for r in rules(op, dev))


def resolve(op: Operator, dev: Device | str | None = None,
            sources: Mapping[str, str] | None = None) -> Operator:
    """A copy of ``op`` with every unset tunable filled for ``dev``, validated whatever its source.

    ``sources`` names where each set tunable came from ("the call", "profile entry ...");
    a value with no recorded source is reported as given to the constructor.  Unset tunables
    take the first combination of ``op.space(dev)`` that is legal beside the set ones.
    """
    dev = device(dev)
    sources = {n: (sources or {}).get(n, "the constructor") for n in op.tunables()
               if getattr(op, n) is not None}
    for name, source in sources.items():
        value = getattr(op, name)
        if type(value) is not int or value < 1:
            raise ResolveError(
                f"{op.describe()} on {dev}: {name}={value!r} (from {source}) breaks the "
                f"rule: a tunable is a positive integer")
    for r in target_for(dev).value_rules(op):
        if not r.ok:
            name, = r.fields
            raise ResolveError(f"{op.describe()} on {dev}: {name}={getattr(op, name)!r} (from "
                               f"{sources[name]}) breaks the rule {r.text}")
    unset = [n for n in op.tunables() if getattr(op, n) is None]
    if unset:
        op = _first_legal(op, dev, unset)
        sources.update({n: f"{DEFAULT_SOURCE} on {dev}" for n in unset})
    check(op, dev, sources)
    return op


def _first_legal(op: Operator, dev: Device, unset: list[str]) -> Operator:
    space = op.space(dev)
    unset = [n for n in space if n in unset]  # space() lists the tunables by priority
    first = None
    for values in itertools.product(*(space[n] for n in unset)):
        candidate = dataclasses.replace(op, **dict(zip(unset, values)))
        first = first or candidate
        if legal(candidate, dev):
            return candidate
    return first  # nothing legal: check() reports the rule the preferred values break


def check(op: Operator, dev: Device, sources: Mapping[str, str]) -> None:
    """Raise ``ResolveError`` for the first rule the resolved instance ``op`` breaks."""
    # a broken rule among values someone chose is reported before one among defaults
    broken = sorted((r for r in rules(op, dev) if not r.ok),
                    key=lambda r: any(sources.get(n, "").startswith(DEFAULT_SOURCE)
                                      for n in r.fields))
    for r in broken[:1]:
        named = ", ".join(f"{n}={getattr(op, n)!r} (from {sources.get(n, 'the call')})"
                          for n in r.fields)
        hint = legal_settings(op, dev)[:3]
        fix = ("; legal settings include " + "; ".join(
            ", ".join(f"{k}={v}" for k, v in s.items()) for s in hint)) if hint else ""
        raise ResolveError(f"{op.describe()} on {dev}: {named} breaks the rule {r.text}{fix}")


def legal_settings(op: Operator, dev: Device | str | None = None) -> list[dict[str, int]]:
    """Every combination of ``op.space(dev)`` that satisfies the rules: the tuner's sweep."""
    dev = device(dev)
    space = op.space(dev)
    names = list(op.tunables())
    settings = []
    for values in itertools.product(*(space[n] for n in names)):
        setting = dict(zip(names, values))
        if legal(dataclasses.replace(op, **setting), dev):
            settings.append(setting)
    return settings


__all__ = ["DEFAULT_SOURCE", "check", "legal", "legal_settings", "resolve", "rules"]
