"""The leader's side of placement (docs/placement.md).

* :mod:`.destinations` -- where healing, the monitor and the shedder may send a bundle, under the rules;
* :mod:`.standbys` -- the job that publishes every bundle's warm standbys;
* :mod:`.admin` and :mod:`.api` -- the policies' admin operations and their HTTP routes.

The rules themselves are pure, in ``balance.placement``; what both daemons follow live is in
``cluster.placement``.
"""
