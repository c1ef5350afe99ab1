import sys

from reservoir.cli import main

sys.exit(main())
