"""Lets ``python -m deploy.cluster`` start the local cluster."""

import sys

from deploy.cluster.main import main

sys.exit(main())
