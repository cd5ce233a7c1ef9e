"""``python -m iron.lm.tune APP --checkpoint DIR``: tune a language-model application.

Times every legal setting of every operator instance the application builds (decode and
prefill) and writes the fastest into ``profiles/<APP>/<device>.json``; review it with
``git diff`` or ``python -m iron.profile diff``.  The generic entry point is
``python -m iron.tuning``; this one keeps the name the tutorial uses.
"""

from __future__ import annotations

import sys

from ..tuning.__main__ import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m iron.lm.tune"))
