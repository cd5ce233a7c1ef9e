"""The build: ``doit`` builds the Llama bundle for the cpu on the embedded checkpoint.

    doit                          # checkpoint, compile every instance, bundle
    doit generate prompt="Hello"  # ... then generate text (doit reserves the name "run")
    doit tune                     # rewrite profiles/<app>/<device>.json
    doit gc                       # drop cache entries nothing references
    doit device=npu2 app=demo checkpoint=DIR march=x86-64-v3 threads=1 ...
                                  # selections; see iron/pipeline/tasks.py
"""

import sys

from doit import create_after, doit_cmd, get_var

from iron.errors import IronError
from iron.pipeline.tasks import DOIT_CONFIG, BuildGraph  # noqa: F401  (doit reads DOIT_CONFIG)

try:
    graph = BuildGraph(get_var, doit_cmd._CMDLINE_VARS)  # doit 0.37 keeps NAME=VALUE pairs there
except IronError as e:  # a bad cache setting or selection: one line, not a traceback
    sys.exit(f"error: {e}")


def task_checkpoint():
    return graph.task_checkpoint()


@create_after(executed="checkpoint")
def task_compile():
    yield from graph.task_compile()


@create_after(executed="checkpoint")
def task_bundle():
    return graph.task_bundle()


@create_after(executed="checkpoint")
def task_generate():
    return graph.task_generate()


def task_tune():
    return graph.task_tune()


@create_after(executed="checkpoint")
def task_gc():
    return graph.task_gc()
