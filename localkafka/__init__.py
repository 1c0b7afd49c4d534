"""Apache Kafka itself, on loopback: its jars fetched from Maven Central and
cached (:mod:`localkafka.fetch`), a KRaft cluster of separate JVMs laid out and
started with every node's request logger at DEBUG (:mod:`localkafka.layout`,
:mod:`localkafka.cluster`), and the failures production meets, scripted
(:mod:`localkafka.nemesis`).

Imports nothing of fencewatch's other packages: it is the real cluster that
fencewatch watches, not part of fencewatch's judgment.
"""
