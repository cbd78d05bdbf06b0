import sys

from orchestrator.submit.cli import main

sys.exit(main())
