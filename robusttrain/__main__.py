"""``python -m robusttrain`` entry point."""

import sys

from robusttrain.cli import main

sys.exit(main())
