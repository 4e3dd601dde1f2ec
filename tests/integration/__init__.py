"""Integration tests: a real ZooKeeper server and the librdkafka mock cluster, started by tests/conftest.py."""
