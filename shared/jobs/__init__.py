"""Owns jobs on Redis: the queue (arq behind one seam), run records, event streams and replies."""
