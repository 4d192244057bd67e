"""Tasks the tests hand to warm's worker processes (``warming.warm(task=...)``). A spawned
worker imports the module of its task to unpickle it: this one imports nothing heavy (a test
module imports torch, seconds a worker)."""

import os
import signal


def die(variant):
    """A warm task that kills its worker."""
    os.kill(os.getpid(), signal.SIGKILL)
