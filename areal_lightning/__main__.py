import sys

from areal_lightning.cli import main

sys.exit(main())
