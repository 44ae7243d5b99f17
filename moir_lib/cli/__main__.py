"""``python -m moir_lib.cli``: the ``moir`` command."""

import sys

from moir_lib.cli import main

sys.exit(main())
