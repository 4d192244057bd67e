"""A fresh interpreter started early: a module-scoped fixture starts it with the module's first
test so that it runs beside the in-process tests (on the other core), and the test that reads
it comes last."""

import contextlib
import subprocess
import sys


@contextlib.contextmanager
def fresh_interpreter(code: str, env: dict | None = None):
    """``python -c code`` running (stdout and stderr piped, text); killed on exit if the test
    that reads it did not get to ``communicate``."""
    child = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        yield child
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
