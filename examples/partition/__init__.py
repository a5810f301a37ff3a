"""``make partition-test``: queueflow workers on separate hosts (Linux network namespaces on one
machine, each worker with its own address, the broker on the bridge) while a nemesis cuts links
under load: leader to broker one way, member to leader, a worker from everything, flapping
links. See docs/operations.md "Network partitions"."""
