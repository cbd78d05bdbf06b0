import sys

from orchestrator.doctor.cli import main

sys.exit(main())
