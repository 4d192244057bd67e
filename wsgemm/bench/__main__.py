"""``python -m wsgemm.bench``: the benchmark without the wsgemm command-line front end."""

import sys

from .cli import main

sys.exit(main())
