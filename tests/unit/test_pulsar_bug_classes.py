"""Bug classes from Apache Pulsar's load manager issue tracker, each pinned as a rule trimtab keeps
(issue 31, point 6; docs/reliability.md lists them with what trimtab does instead).

The classes that need processes are tested where the processes are: a broker restarted while a bundle it
was Assigning is in flight (apache/pulsar#25379) in tests/unit/test_session_barrier.py and the network
chaos run (tests/integration/test_chaos_network.py)."""

from __future__ import annotations

from trimtab.balance.load import BundleStats
from trimtab.balance.roles import Close, Fence, Publish, SplitOnBroker, plan
from trimtab.balance.split import SplitLimits, children_for
from trimtab.channel import intents
from trimtab.channel.bundles import parse_bundle
from trimtab.channel.records import Record, State, make
from trimtab.channel.resolve import ACCEPT, Verdict, resolve

A, B = "a:1", "b:2"
BUNDLE = "t/ns/0x00000000_0x80000000"
RNG = parse_bundle(BUNDLE)[1]
NOW = 1_700_000_000_000


def owned(by: str, v: int) -> Record:
    return make(State.OWNED, dst=by, version=v, ts=1, writer=by)


def test_a_stale_unload_cannot_release_a_bundle_owned_again_apache_pulsar_26197() -> None:
    """apache/pulsar#26197: an unload decided while A owned the bundle, applied after the bundle had moved
    and been acquired again, released the new owner's bundle -- and two brokers served it. In trimtab an
    unload is a record built on the version it saw: after the bundle moved on it is the loser of a race
    (an older version) or, built on a newer one, names a source that no longer owns it."""
    decided_on = owned(A, 4)
    late_unload = intents.release(decided_on, src=A, dst=None, writer="leader", now_ms=NOW)
    now = owned(B, 8)  # meanwhile: released, freed, assigned to B, owned by B
    assert resolve(RNG, now, late_unload) is Verdict.STALE_VERSION
    # The same stale decision retried with the current version still names A, who no longer owns it.
    retried = make(State.RELEASING, src=A, dst=None, version=9, ts=1, writer="leader")
    assert resolve(RNG, now, retried) is Verdict.BROKER_MISMATCH
    # The current owner's own unload is accepted: the rule is not "refuse every unload".
    assert resolve(RNG, now, intents.release(now, src=B, dst=None, writer="leader", now_ms=NOW)) is ACCEPT


def test_a_retried_split_keeps_its_boundaries_apache_pulsar_19988() -> None:
    """apache/pulsar#19988: a split retried after a failure computed its boundaries again from the load of
    that moment and split at different points. In trimtab the boundaries are chosen once, written into the
    ``Splitting`` record, and every attempt (a retry, another incarnation of the agent) splits at the
    boundaries the record names, whatever the load says now."""
    lim = SplitLimits(algorithm="topic_count_equally_divide")
    before = BundleStats(bundle=BUNDLE, topic_loads={0x10000000: 1.0, 0x20000000: 1.0, 0x70000000: 1.0})
    children = [c.name for c in children_for(before, lim)]
    assert children
    rec = intents.split(owned(A, 4), A, children, writer=A, now_ms=NOW)
    after = BundleStats(bundle=BUNDLE, topic_loads={0x60000000: 1.0, 0x70000000: 1.0, 0x7F000000: 1.0})
    assert [c.name for c in children_for(after, lim)] != children  # the load moved: another cut now
    for _attempt in range(3):
        p = plan(A, BUNDLE, rec, serving=True, fenced=False, now_ms=NOW)
        assert p is not None and p.kind == "split"
        (split_step,) = [s for s in p.steps if isinstance(s, SplitOnBroker)]
        assert [c.rsplit("/", 1)[1] for c in split_step.children] == sorted(children)


def test_unloading_never_waits_for_its_own_release_apache_pulsar_21332_23349() -> None:
    """apache/pulsar#21332, #23349: a broker closing down published its Releasing and then waited for its
    own channel to deliver it back -- after that channel had been closed, so the close path hung. In
    trimtab a broker's part of an unload is local work first (fence, close the bundle on the broker), then
    one publish; no step waits for a record of its own, and a drain has a deadline
    (``agent.drain_timeout_s``)."""
    rec = intents.release(owned(A, 4), src=A, dst=None, writer=A, now_ms=NOW)
    p = plan(A, BUNDLE, rec, serving=True, fenced=False, now_ms=NOW)
    assert p is not None and p.kind == "unload"
    kinds = [type(s) for s in p.steps]
    assert kinds == [Fence, Close, Publish]  # the publish is the last step: nothing after it to wait for
