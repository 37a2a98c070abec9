import sys

from areal_lightning.app.cli import main

sys.exit(main())
