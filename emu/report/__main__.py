"""``python -m emu.report RUN_DIR``: see ``emu.report.cli``."""

import sys

from emu.report.cli import main

sys.exit(main())
