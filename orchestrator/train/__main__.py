import sys

from orchestrator.train.cli import main

sys.exit(main())
