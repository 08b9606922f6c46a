"""``python -m capkv`` runs the ``capkv`` command line."""

import sys

from capkv.cli._main import main

sys.exit(main())
