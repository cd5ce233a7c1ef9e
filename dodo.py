"""The build: ``doit`` builds the Llama bundle for the cpu on the embedded checkpoint.

    doit                          # checkpoint, compile every instance, bundle
    doit generate prompt="Hello"  # ... then generate text (doit reserves the name "run")
    doit tune                     # rewrite profiles/<app>/<device>.json
    doit gc                       # drop cache entries nothing references
    doit list                     # the tasks, each with its variables and their defaults
    doit device=npu2 checkpoint=FILE.gguf context=4096 weights=bf16 verbose=1 ...
                                  # selections; see iron/pipeline/tasks.py
"""

import sys

from doit import doit_cmd

from iron.errors import IronError
from iron.pipeline.tasks import dodo_namespace

try:  # doit 0.37 keeps the command line's NAME=VALUE pairs in _CMDLINE_VARS
    globals().update(dodo_namespace(doit_cmd._CMDLINE_VARS))
except IronError as e:  # a bad cache setting or selection: one line, not a traceback
    sys.exit(f"error: {e}")
