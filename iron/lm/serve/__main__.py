"""``python -m iron.lm.serve BUNDLE``: the OpenAI-compatible server (``cli.main``)."""

import sys

from .cli import main

sys.exit(main())
