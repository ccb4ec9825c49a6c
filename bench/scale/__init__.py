"""Owns ``make bench-scale``: where one gateway process and one Redis stop, with fake-engine workers."""
