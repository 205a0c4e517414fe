"""idem's black-box tests: Python standard library only; see harness.py."""
