"""``python -m iron.lm.tune APP --checkpoint DIR``: tune a language-model application.

Times the legal settings of every operator instance the application builds (decode and
prefill), each alone and then the best against the setting in use inside its program, and
writes what makes the whole model faster into ``profiles/<APP>/<device>.json`` (on the cpu
``cpu-<host class>.json``, see ``docs/tuning.md``); review it with ``git diff`` or ``python -m
iron.profile diff``.  The generic entry point is
``python -m iron.tuning``; this one keeps the name the tutorial uses.
"""

from __future__ import annotations

import sys

from ..tuning.__main__ import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m iron.lm.tune"))
