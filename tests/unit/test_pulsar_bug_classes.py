"""Bug classes from Apache Pulsar's load manager issue tracker, each pinned as a rule trimtab keeps
(issue 31, point 6; docs/reliability.md lists them with what trimtab does instead).

The classes that need processes are tested where the processes are: a broker restarted while a bundle it
was Assigning is in flight (apache/pulsar#25379) in tests/unit/test_session_barrier.py and the network
chaos run (tests/integration/test_chaos_network.py)."""

from __future__ import annotations

import random
from typing import Any, cast

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from tests.support.owned_table import OwnedRecords
from trimtab.agent.drain import Drainer
from trimtab.agent.leases import lease_bound
from trimtab.agent.metrics import AgentMetrics
from trimtab.balance.assign import AssignContext, BrokerInfo
from trimtab.balance.load import BrokerLoadData, BundleStats
from trimtab.balance.roles import Close, Fence, Publish, SplitOnBroker, plan
from trimtab.balance.split import SplitLimits, children_for
from trimtab.channel import intents
from trimtab.channel.bundles import parse_bundle
from trimtab.channel.records import Record, State, make
from trimtab.channel.resolve import ACCEPT, Verdict, resolve
from trimtab.cluster.placement.store import IsolationPolicies, IsolationPolicyDoc, PlacementDocs
from trimtab.cluster.placement.view import LivePlacement

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


# ------------------------------------------------------------------ one source of ownership truth
OTHER_STATES = st.sampled_from([State.OWNED, State.FREE, State.ASSIGNING, State.RELEASING])


@given(state=OTHER_STATES, version=st.integers(1, 1000), fenced=st.booleans())
def test_the_channel_is_the_only_ownership_truth_apache_pulsar_20528(
    state: State, version: int, fenced: bool
) -> None:
    """apache/pulsar#20528: the service-unit channel and the broker's ownership cache disagreed -- two
    sources of truth -- and the broker kept serving (and answering lookups for) a bundle the channel gave
    to another. In trimtab what a broker serves is only ever a consequence of the channel: a broker
    serving a bundle whose record names another owner (or nobody) is told to close it, and its agent stops
    vouching for it, so even a close that fails ends with the lease."""
    dst = B if state in (State.OWNED, State.ASSIGNING) else None
    src = A if state is State.RELEASING else None
    rec = make(state, dst=dst, src=src, version=version, ts=NOW, writer="leader")
    if state is State.RELEASING:  # A's own unload in flight: A fences, closes, then publishes Free
        p = plan(A, BUNDLE, rec, serving=True, fenced=False, now_ms=NOW)
        assert p is not None and Close in [type(s) for s in p.steps]
        assert lease_bound(A, rec, now_ms=NOW, in_flight_timeout_s=30, margin_s=2, stale=False) is None
        return
    p = plan(A, BUNDLE, rec, serving=not fenced, fenced=fenced, now_ms=NOW)
    assert p is not None and [type(s) for s in p.steps] == [Close]
    assert lease_bound(A, rec, now_ms=NOW, in_flight_timeout_s=30, margin_s=2, stale=False) is None
    # Nor does a bundle the channel has no record of stay served.
    gone = plan(A, BUNDLE, None, serving=True, fenced=False, now_ms=NOW)
    assert gone is not None and [type(s) for s in gone.steps] == [Close]


# ------------------------------------------------------------------ rolling restarts keep placement
ISO_NS = "t/iso"
ISO_BUNDLE = f"{ISO_NS}/0x00000000_0x40000000"
FREE_BUNDLE = "t/free/0x00000000_0x40000000"
NOW_MS = 1_700_000_000_000


def _drain_destination(draining: str, live: list[str], bundle: str) -> str | None:
    """Where the drain of ``draining`` sends ``bundle``, through the agent's own live placement rule, with
    an isolation policy for ``t/iso`` (primaries p1 and p2, secondary s1, at least one primary). The
    draining broker is registered as draining, as a drain does before it picks destinations."""
    brokers = {
        b: BrokerInfo(id=b, service_url=f"svc://{b}", http_url=f"http://{b}", draining=b == draining)
        for b in live
    }
    view = LivePlacement(lambda: brokers, failure_domains_enabled=False, table=OwnedRecords())
    doc = IsolationPolicyDoc(namespaces=[ISO_NS], primary=["p[12]"], secondary=["s1"], min_limit=1)
    view.policies_changed(PlacementDocs(isolation=IsolationPolicies(policies={"iso": doc})))
    registry = cast(Any, type("Registry", (), {"brokers": brokers})())
    loads = {b: BrokerLoadData(broker=b, weighted_max_ema=0.1, updated_at=NOW_MS) for b in live}
    drainer = Drainer(
        cast(Any, type("Identity", (), {"id": draining})()),
        cast(Any, None),
        cast(Any, None),
        registry,
        assign_context=lambda exclude: AssignContext(loads=loads, now_ms=NOW_MS, exclude=exclude),
        placement=view.restrict,
        rng=random.Random(1),
        metrics=AgentMetrics.create(CollectorRegistry()),
        timeout_s=10,
        diff=0.1,
    )
    return drainer.destination(bundle).broker


@pytest.mark.parametrize("draining", ["p1:1", "p2:1", "s1:1", "x:1", "y:1"])
def test_a_rolling_restart_moves_policy_bound_bundles_only_within_their_policy_apache_pulsar_21213_20551(
    draining: str,
) -> None:
    """apache/pulsar#21213, #20551: during a rolling restart, bundles pinned by an isolation policy (and
    the system bundles Pulsar pins to each broker) were moved to brokers their policy excludes. In trimtab a
    restart drains through the same placement rule as every other assignment: a policy-bound bundle goes to
    another of its primaries, to a secondary only when too few primaries are left, and when the rule allows
    nobody it is unloaded (unowned until an allowed broker is back) -- never placed on an excluded broker.
    Unpoliced bundles never land on a policy's primaries."""
    live = ["p1:1", "p2:1", "s1:1", "x:1", "y:1"]
    for _ in range(20):  # every pick, not one lucky draw
        dst = _drain_destination(draining, live, ISO_BUNDLE)
        assert dst in ({"p1:1", "p2:1"} - {draining}), dst
        free = _drain_destination(draining, live, FREE_BUNDLE)
        assert free in ({"s1:1", "x:1", "y:1"} - {draining}), free


def test_the_last_primary_restarting_falls_back_to_the_secondary_then_to_nobody() -> None:
    # p2 is down; p1 restarts: fewer primaries than min_limit are left, the secondary takes it.
    assert _drain_destination("p1:1", ["p1:1", "s1:1", "x:1"], ISO_BUNDLE) == "s1:1"
    # Neither p2 nor the secondary is up: unloaded, not moved to x.
    assert _drain_destination("p1:1", ["p1:1", "x:1"], ISO_BUNDLE) is None
