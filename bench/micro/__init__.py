"""Brokerless micro-benchmarks (``make bench-micro`` / ``python -m bench.micro``).

Everything runs in this process, without Kafka or Faust: the share-partition engine
(:mod:`bench.micro.engine`), the state and wire codecs (:mod:`bench.micro.codecs`), the
member's read path from Kafka record-batch bytes (:mod:`bench.micro.readpath`) and a share
agent's dispatch in an in-process cluster (:mod:`bench.micro.dispatch`). Each benchmark
reports µs per unit (a record, a message or a call): the median of at least seven repeats and
the min..max spread (:mod:`bench.micro.timing`). The CLI and the JSON are in
:mod:`bench.micro.suite`.
"""
