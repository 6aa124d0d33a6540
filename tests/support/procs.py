"""``harness.procs`` under the name the tests have always used (shared with ``scripts/``).

The module itself is put in place of this one, so every name, private ones and patches
included, is the same object under both names."""

import sys

import harness.procs

sys.modules[__name__] = harness.procs
