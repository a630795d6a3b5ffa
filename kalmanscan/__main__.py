import sys

from kalmanscan.cli import main

sys.exit(main())
