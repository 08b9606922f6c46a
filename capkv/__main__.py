"""``python -m capkv`` runs the ``capkv`` command line."""

import sys

from capkv.cli.main import main

sys.exit(main())
