"""The placement rules as the daemons follow them (docs/placement.md).

* :mod:`.store` -- the policies in ZooKeeper (failure domains, anti-affinity groups, isolation policies),
  read, written and watched;
* :mod:`.view` -- the live rules over the registered brokers and the channel's ownership, which every
  decision asks;
* :mod:`.standbys` -- the standby topic's index and the preference for a bundle's warm standbys.

The rules themselves are pure, in ``balance.placement``; the leader's placement jobs and admin surface are
in ``controller.placement``.
"""
