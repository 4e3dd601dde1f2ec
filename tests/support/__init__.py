"""Helpers shared by the test suites (no tests here).

* :mod:`tests.support.waiting` -- ``wait_for``: how tests synchronise (conditions with deadlines, no sleeps).
* :mod:`tests.support.procs` -- subprocesses (the trimtab CLI, helper scripts) in their own process groups,
  output captured to files, always killed at teardown.
* :mod:`tests.support.kafka` -- per-test topics and transports on the session's librdkafka mock cluster.
* :mod:`tests.support.channel_race` -- racing channel writers and garbage records (replica tests).
* :mod:`tests.support.channel_reader` -- a live channel follower run as a subprocess (``python -m``).
"""
