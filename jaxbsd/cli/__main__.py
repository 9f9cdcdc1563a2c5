"""``python -m jaxbsd.cli``: the ``jaxbsd`` console command."""

import sys

from jaxbsd.cli import main

sys.exit(main())
