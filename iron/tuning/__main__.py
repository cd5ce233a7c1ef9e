"""``python -m iron.tuning APP [--var NAME=VALUE ...] --checkpoint DIR``: tune an application
and rewrite its profile.  ``--var NAME=VALUE`` sets one of the application's variables (those
``doit`` takes, e.g. ``weights=bf16``): the instances of that build are tuned, and entries for
others are kept.

Times the legal settings of every operator instance the application builds (by default only the
cost model's ``--prune`` fastest of each and the setting in use; ``--full`` times all), each
alone, then the sweep's fastest against the setting in use inside the program it runs in, and
writes what the whole model gains from into ``profiles/<APP>/<device>.json`` (on the cpu
``cpu-<host class>.json``: ``$IRON_THREADS`` and ``$IRON_MARCH`` select another class, see
``iron.host.class_name``); on a device this machine cannot run, ranks them by
the target's cost model instead and says so; review it with ``git diff`` or ``python -m
iron.profile diff``.  Measurements are logged under ``build/tune/``, so an interrupted run
picks up where it stopped.  ``--scheduler tcp://HOST:PORT`` runs compiles and
measurements on a Dask cluster (``iron.tuning.cluster``).
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from ..devices import device as get_device
from ..errors import IronError
from ..paths import build_dir
from ..pipeline.app import open_app, profile_path
from ..targets import target_for
from ..util import finite_float
from .measure import TargetBenchmark
from .quiet import QUIET
from .model import DEFAULT_PRUNE
from .tuner import TuneOptions, tune


def main(argv: Sequence[str] | None = None, prog: str = "python -m iron.tuning") -> int:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Tune an application's operators and rewrite profiles/<APP>/<device>.json.")
    parser.add_argument("app", help="the application, a package apps/<APP>")
    parser.add_argument("--checkpoint", help="the checkpoint directory (default: the "
                        "application's own)")
    parser.add_argument("--device", default="cpu", help="the device to tune for (default cpu)")
    parser.add_argument("--var", action="append", default=[], metavar="NAME=VALUE",
                        help="one of the application's variables (as `doit NAME=VALUE` takes "
                        "it; repeatable): the instances of that bundle are tuned, entries for "
                        "other selections are kept")
    parser.add_argument("--only", help="tune only these operators, comma-separated "
                        "(e.g. GEMV,RMSNorm); entries for the others are kept as they are")
    parser.add_argument("--budget", type=finite_float, help="stop after this many seconds, keeping "
                        "the best setting found so far for each instance")
    parser.add_argument("--fresh", action="store_true", help="discard the tuning log and "
                        "measure everything again")
    parser.add_argument("--max-load", type=finite_float, default=QUIET,
                        help="cores' worth of CPU other processes may use while a timing is "
                             f"taken; above it the tuner pauses (default {QUIET:g}). Each "
                             "timing's load is logged, and a head-to-head taken above the "
                             "default is not reused by a later run")
    parser.add_argument("--scheduler", metavar="tcp://HOST:PORT", help="run compiles on any "
                        "worker and measurements on the workers that offer the device as a "
                        "resource (dask worker ADDR --nthreads 1 --resources cpu=1) of this "
                        "Dask scheduler; the log and the profile stay here")
    parser.add_argument("--prune", type=int, default=DEFAULT_PRUNE, metavar="K",
                        help="measure only the cost model's K fastest candidates of each "
                        f"instance, plus the setting in use (default {DEFAULT_PRUNE}; 0 measures "
                        "every legal setting)")
    parser.add_argument("--full", action="store_true", help="measure every legal setting "
                        "(the same as --prune 0)")
    parser.add_argument("--out", metavar="FILE", help="write the profile here instead of "
                        "the application's profile for this device and host class (which is "
                        "still where the previous settings are read from)")
    parser.add_argument("--plots", metavar="DIR", help="one chart per tuned instance (needs "
                        "the plots extra, matplotlib); default build/tune/plots/<APP>-<profile>")
    parser.add_argument("--no-plots", action="store_true", help="draw no charts")
    args = parser.parse_args(argv)
    if args.max_load < 0:
        parser.error(f"--max-load must be a non-negative number, got {args.max_load:g}")
    if args.prune < 0:
        parser.error(f"--prune must be 0 (measure everything) or a positive number of "
                     f"candidates, got {args.prune}")
    if args.budget is not None and args.budget <= 0:
        parser.error(f"--budget must be a positive number of seconds, got {args.budget:g}")
    only = tuple(n.strip() for n in args.only.split(",") if n.strip()) if args.only else ()
    variables = {}
    for given in args.var:
        name, equals, value = given.partition("=")
        if not equals or not name:
            parser.error(f"--var {given!r}: an application variable is NAME=VALUE (e.g. "
                         "--var weights=bf16)")
        if name in variables:
            parser.error(f"{name}: the variable is given twice ({name}={variables[name]}, "
                         f"{given})")
        variables[name] = value
    try:
        app = open_app(args.app, args.checkpoint, variables)
        dev = get_device(args.device)
        # a device that cannot run here is ranked by its target's cost model (tune says so)
        bench = (None if target_for(dev).unavailable(dev)
                 else TargetBenchmark(dev, quiet=args.max_load))
        plots = None if args.no_plots else (
            args.plots or build_dir() / "tune" / "plots" /
            f"{args.app}-{profile_path(args.app, dev.name).stem}")
        options = TuneOptions(only=only, budget=args.budget, fresh=args.fresh,
                              scheduler=args.scheduler, prune=0 if args.full else args.prune,
                              plots=plots, profile_path=args.out,
                              previous_path=profile_path(args.app, dev.name) if args.out else None)
        tune(app, args.device, options, benchmark=bench)
    except IronError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ninterrupted: the profile is unchanged; every finished measurement is logged, "
              "so running the same command again resumes", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
