import sys

from orchestrator.search.cli import main

sys.exit(main())
