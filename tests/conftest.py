import os
import sys

# Let the tests run from a plain checkout as well as from an installed package.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))
