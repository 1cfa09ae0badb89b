"""`python -m ember.gateway --config gateway.yaml --port P`: same as `ember gateway`."""

import sys

from ember.gateway.cli import main

sys.exit(main())
