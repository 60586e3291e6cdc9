"""Where the tests find things: their own directory (support modules, data/) and the
repository's root, wherever the test module that asks sits below tests/."""
import os

TESTS = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(TESTS)
DATA = os.path.join(TESTS, "data")
