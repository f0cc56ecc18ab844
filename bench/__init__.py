"""Side-by-side benchmarks of homing against its peers (issue 9). Run ``python -m bench``."""
