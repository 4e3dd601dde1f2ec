"""The development kit: what runs trimtab locally and measures it, never part of a deployment.

A real ZooKeeper server launcher, a real Apache Kafka (KRaft) launcher (``kafka_server``; the jars from
Maven Central, fetched by scripts/setup.sh), the librdkafka mock Kafka cluster, the local cluster
(``trimtab dev up``), the image's build context (``docker_context``) and the benchmarks. The daemons never import it (import-linter enforces that); the wheel and the container
image do not carry it: it ships with the source repository.
"""

from trimtab import refuse_bare_import

refuse_bare_import(__name__)
