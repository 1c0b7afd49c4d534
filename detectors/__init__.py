"""fencewatch's pure detection core: parsing at the edge, the authoritative
cluster view, and the fencing rules. Imports none of the other packages, nor
Spark, Kafka, HTTP or Prometheus (STYLE.md practice 1)."""
