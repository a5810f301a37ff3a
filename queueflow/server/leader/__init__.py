"""Share-partition leaders, split by concern the way Kafka's broker splits them.

* :mod:`~queueflow.server.leader.manager`: :class:`ShareLeader`, the public entry point of one
  source topic's leaders: request routing and the one place results are performed
  (``SharePartitionManager``).
* :mod:`~queueflow.server.leader.cache`: the share-partition cache and each share-partition's
  lifecycle (:class:`~queueflow.server.leader.cache.SharePartitionState`).
* :mod:`~queueflow.server.leader.handlers`, :mod:`~queueflow.server.leader.resets`,
  :mod:`~queueflow.server.leader.fencing`: pure handlers that return
  :mod:`~queueflow.server.leader.results`.
* :mod:`~queueflow.server.leader.parking`: the direct path's batches and long polls
  (``DelayedShareFetch``).
* :mod:`~queueflow.server.leader.positions`: the last request applied per request partition;
  :mod:`~queueflow.server.leader.reports`: gauges' samples, lag, Archived counts.
"""

from queueflow.server.leader.manager import MAX_REPLAYED_REQUESTS, ShareLeader

__all__ = ["MAX_REPLAYED_REQUESTS", "ShareLeader"]
