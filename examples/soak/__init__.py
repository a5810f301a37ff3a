"""``make soak``: see :mod:`examples.soak.__main__`."""
