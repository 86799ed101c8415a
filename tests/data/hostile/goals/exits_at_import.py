"""A program module that ends the process while it is imported."""

import sys

sys.exit(4)
