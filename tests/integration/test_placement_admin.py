"""The placement-policy admin API (controller/placement/api.py over controller/placement/admin.py): failure
domains, anti-affinity groups and isolation policies stored in a real ZooKeeper, isolation changes
unloading bundles on the in-memory channel, through a controller built by the production wiring.

Every endpoint's success and refusals: 404s, 400s (names, namespaces, regexes, fields), 409 for a broker in
two domains, a follower's redirect or 503, contention (503, retryable), and an unreadable znode (500 naming
it, left as it is). For isolation changes, ``unload_scope`` none/changed/all_matching moves exactly the
bundles Pulsar would, and a dry run writes nothing.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import msgspec
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from httpx import Response
from kazoo.client import KazooClient

from tests.conftest import stopped_at_teardown
from tests.integration.test_controller_jobs import Node, register
from tests.support.settings import NO_AUTH_SETS
from tests.support.waiting import wait_for
from trimtab.channel.memory import MemoryLog
from trimtab.channel.records import State, make
from trimtab.channel.table import TableView
from trimtab.cluster.auth import Authenticator, secure_app
from trimtab.cluster.http_errors import install_error_handlers
from trimtab.cluster.placement.store import PlacementDocs, PlacementStore, PlacementWatch, znode_paths
from trimtab.cluster.zk import ZkPaths
from trimtab.config.loader import load_settings, parse_assignments
from trimtab.config.settings import Settings
from trimtab.controller.journal import DecisionJournal
from trimtab.controller.placement.admin import PlacementAdmin
from trimtab.controller.placement.api import add_placement_routes
from trimtab.controller.writes import ChannelWrites

pytestmark = pytest.mark.integration

HALVES = ("0x00000000_0x80000000", "0x80000000_0xffffffff")


@dataclass
class Api:
    """One controller node, its placement service and an HTTP client on the placement routes."""

    node: Node
    admin: PlacementAdmin
    http: TestClient

    @property
    def table(self) -> TableView:
        return self.node.ctl.channel.table

    def __enter__(self) -> Api:
        self.http.__enter__()  # one event loop for every request of the test
        return self

    def __exit__(self, *exc: object) -> None:
        self.http.__exit__(None, None, None)


def make_api(node: Node, s: Settings, store: PlacementStore | None = None) -> Api:
    c = node.ctl
    admin = PlacementAdmin(
        store or PlacementStore(c.zk.client, ZkPaths(s.zk_path)),
        c.leadership,
        c.channel.table,
        c.registry,
        ChannelWrites(c.channel, c.leadership, c.metrics),
        DecisionJournal(c.events),
        c.metrics,
    )
    app = FastAPI()
    install_error_handlers(app)
    add_placement_routes(app, lambda: admin)
    secure_app(app, Authenticator.disabled())  # tokens are test_security.py's
    return Api(node, admin, TestClient(app, follow_redirects=False))


def refused(r: Response, status: int, *needles: str, retryable: bool = False) -> str:
    body = r.json()
    assert r.status_code == status, (r.status_code, body)
    assert set(body) == {"error", "retryable"} and body["retryable"] is retryable, body
    for n in needles:
        assert n in body["error"], (n, body["error"])
    return str(body["error"])


def ok(r: Response) -> Any:
    assert r.status_code == 200, (r.status_code, r.text)
    return r.json()


# ---------------------------------------------------------------------------------------------- fixtures


@pytest.fixture
def settings(zk_hosts: str) -> Settings:
    sets = [f"zookeeper.hosts={zk_hosts}", "zookeeper.session_timeout_s=6", "http.port=0", *NO_AUTH_SETS]
    return load_settings(None, parse_assignments(sets), environ=False)


@pytest.fixture
def nodes() -> Iterator[list[Node]]:
    yield from stopped_at_teardown()


@pytest.fixture
def paths(settings: Settings) -> dict[str, str]:
    return znode_paths(ZkPaths(settings.zk_path))


@pytest.fixture
def leader(settings: Settings, log: MemoryLog, nodes: list[Node]) -> Iterator[Api]:
    node = Node(settings, log).start()
    nodes.append(node)
    wait_for(lambda: node.ctl.leadership.is_leader, message="the only controller leads")
    with make_api(node, settings) as api:
        yield api


def own(api: Api, owners: dict[str, str]) -> None:
    """Bring each bundle to Owned by ``broker`` from wherever it is (Init, or Releasing after an unload)."""
    now = int(time.time() * 1000)
    for key, broker in owners.items():
        cur = api.table.get(key)
        v = cur.version if cur else 0
        if cur is not None and cur.state is State.OWNED:
            continue
        if cur is not None and cur.state is State.RELEASING:
            api.node.publish(key, make(State.FREE, version=v + 1, ts=now, writer=str(cur.src), src=cur.src))
            v += 1
        api.node.publish(key, make(State.ASSIGNING, version=v + 1, ts=now, writer="test", dst=broker))
        api.node.publish(key, make(State.OWNED, version=v + 2, ts=now, writer=broker, dst=broker))
    wait_for(lambda: all((r := api.table.get(k)) and r.state is State.OWNED for k in owners), message="owned")


def releasing(api: Api) -> set[str]:
    return {k for k, r in api.table.items() if r.state is State.RELEASING}


def bundles(*namespaces: str) -> list[str]:
    return [f"{ns}/{h}" for ns in namespaces for h in HALVES]


# ---------------------------------------------------------------------------------------------- failure domains


def test_failure_domains_crud_one_domain_per_broker_and_watchers_see_every_change(
    leader: Api, zk: KazooClient, settings: Settings, paths: dict[str, str]
) -> None:
    http = leader.http
    seen: list[PlacementDocs] = []
    watch = PlacementWatch(zk, ZkPaths(settings.zk_path), seen.append)
    watch.start()

    assert ok(http.get("/v1/failure-domains")) == {}
    refused(http.get("/v1/failure-domains/rack1"), 404, "no failure domain named 'rack1'")
    refused(http.delete("/v1/failure-domains/rack1"), 404, "rack1")

    # Create: brokers are stored sorted and without duplicates.
    body = ok(http.put("/v1/failure-domains/rack1", json={"brokers": ["b2:8080", "b1:8080", "b2:8080"]}))
    assert body == {"brokers": ["b1:8080", "b2:8080"]}
    assert ok(http.get("/v1/failure-domains/rack1")) == body
    raw, _ = zk.get(paths["domains"])
    assert msgspec.json.decode(raw) == {"domains": {"rack1": {"brokers": ["b1:8080", "b2:8080"]}}}
    wait_for(lambda: watch.docs.domains.domains.get("rack1"), message="a watcher sees the new domain")

    # A broker already in another domain: 409 naming the broker and that domain; nothing written.
    _, before = zk.get(paths["domains"])
    refused(
        http.put("/v1/failure-domains/rack2", json={"brokers": ["b3:8080", "b2:8080"]}),
        409,
        "b2:8080",
        "'rack1'",
    )
    assert zk.get(paths["domains"])[1].version == before.version
    # ... while the domain itself may be updated with its own brokers.
    ok(http.put("/v1/failure-domains/rack1", json={"brokers": ["b1:8080", "b2:8080", "b4:8080"]}))
    ok(http.put("/v1/failure-domains/rack2", json={"brokers": ["b3:8080"]}))
    assert ok(http.get("/v1/failure-domains")) == {
        "rack1": {"brokers": ["b1:8080", "b2:8080", "b4:8080"]},
        "rack2": {"brokers": ["b3:8080"]},
    }

    # Names and broker ids are checked; bodies are closed.
    refused(http.put("/v1/failure-domains/rack 3", json={"brokers": []}), 400, "invalid failure domain name")
    refused(http.put("/v1/failure-domains/" + "r" * 65, json={"brokers": []}), 400, "longer than 64")
    refused(http.get("/v1/failure-domains/rack$"), 400, "invalid failure domain name")
    refused(http.put("/v1/failure-domains/rack3", json={"brokers": ["b 5:80"]}), 400, "brokers[0]")
    refused(http.put("/v1/failure-domains/rack3", json={"brokers": [""]}), 400, "brokers[0]")
    refused(http.put("/v1/failure-domains/rack3", json={"broker": ["b5:80"]}), 400, "brokers")
    refused(
        http.put("/v1/failure-domains/rack3", content=b"{", headers={"content-type": "application/json"}),
        400,
        "not valid JSON",
    )

    # Delete returns what was removed; the broker may then join another domain.
    assert ok(http.delete("/v1/failure-domains/rack1")) == {"brokers": ["b1:8080", "b2:8080", "b4:8080"]}
    refused(http.get("/v1/failure-domains/rack1"), 404, "rack1")
    ok(http.put("/v1/failure-domains/rack2", json={"brokers": ["b2:8080", "b3:8080"]}))
    wait_for(
        lambda: set(watch.docs.domains.domains) == {"rack2"} and seen[-1].domains == watch.docs.domains,
        message="the watcher follows every change",
    )
    kinds = [d["kind"] for d in leader.admin.journal.recent()]
    assert kinds.count("failure_domain_set") == 4 and kinds.count("failure_domain_deleted") == 1
    assert leader.node.metric("trimtab_admin_requests_total", op="failure_domain", result="refused") == 6


# ---------------------------------------------------------------------------------------------- anti-affinity


def test_anti_affinity_groups_set_clear_and_list_case_insensitively(
    leader: Api, zk: KazooClient, paths: dict[str, str]
) -> None:
    http = leader.http
    aa = "/v1/namespaces/{}/anti-affinity".format
    assert ok(http.get(aa("acme/orders"))) == {"namespace": "acme/orders", "group": None}
    assert ok(http.get("/v1/anti-affinity/payments")) == {"group": "payments", "namespaces": []}
    refused(http.delete(aa("acme/orders")), 404, "acme/orders is in no anti-affinity group")

    assert ok(http.put(aa("acme/orders"), json={"group": "Payments"})) == {
        "namespace": "acme/orders",
        "group": "Payments",
    }
    ok(http.put(aa("acme/billing"), json={"group": "payments"}))
    ok(http.put(aa("acme/web"), json={"group": "frontend"}))
    assert ok(http.get(aa("acme/orders")))["group"] == "Payments"  # stored as given
    assert ok(http.get("/v1/anti-affinity/PAYMENTS")) == {
        "group": "PAYMENTS",
        "namespaces": ["acme/billing", "acme/orders"],
    }
    raw, _ = zk.get(paths["groups"])
    assert msgspec.json.decode(raw) == {
        "groups": {"acme/billing": "payments", "acme/orders": "Payments", "acme/web": "frontend"}
    }

    # A blank group clears; DELETE clears and says which group it was.
    assert ok(http.put(aa("acme/billing"), json={"group": "  "})) == {
        "namespace": "acme/billing",
        "group": None,
    }
    assert ok(http.put(aa("acme/never"), json={"group": ""}))["group"] is None  # clearing nothing is fine
    assert ok(http.delete(aa("acme/orders"))) == {"namespace": "acme/orders", "group": "Payments"}
    assert ok(http.get("/v1/anti-affinity/payments"))["namespaces"] == []
    assert msgspec.json.decode(zk.get(paths["groups"])[0]) == {"groups": {"acme/web": "frontend"}}

    # Refusals: a namespace that is not tenant/name, a group name with a space, a missing field.
    refused(http.get(aa("_acme/orders")), 400, "invalid namespace '_acme/orders'")
    refused(http.put(aa("acme/or ders"), json={"group": "g"}), 400, "invalid namespace")
    refused(http.put(aa("acme/orders"), json={"group": "pay ments"}), 400, "invalid anti-affinity group name")
    refused(http.put(aa("acme/orders"), json={}), 400, "group")
    refused(http.get("/v1/anti-affinity/pay%20ments"), 400, "invalid anti-affinity group name")


# ---------------------------------------------------------------------------------------------- isolation CRUD

GOLD = {"namespaces": ["vip/.*"], "primary": [r"iso\d+"], "secondary": ["b1"], "min_limit": 1}


def test_isolation_policies_crud_validation_and_the_broker_views(
    leader: Api, zk: KazooClient, settings: Settings, paths: dict[str, str]
) -> None:
    http = leader.http
    assert ok(http.get("/v1/isolation-policies")) == {}
    refused(http.get("/v1/isolation-policies/gold"), 404, "no isolation policy named 'gold'")
    refused(http.delete("/v1/isolation-policies/gold"), 404, "gold")

    # Validation: every regex compiles (the message names the field, index and regex), the lists that must
    # not be empty are not, min_limit is an integer >= 0, the scope is known, the body is closed.
    pol = "/v1/isolation-policies/gold"
    refused(
        http.put(pol, json={**GOLD, "primary": ["iso1", "("]}),
        400,
        "isolation policy 'gold': primary[1] '(' is not a valid regular expression",
    )
    refused(http.put(pol, json={**GOLD, "namespaces": ["vip/[a-"]}), 400, "namespaces[0] 'vip/[a-'")
    refused(http.put(pol, json={**GOLD, "secondary": ["b1", "*"]}), 400, "secondary[1] '*'")
    refused(http.put(pol, json={**GOLD, "namespaces": []}), 400, "namespaces must not be empty")
    refused(http.put(pol, json={**GOLD, "primary": []}), 400, "primary must not be empty")
    refused(http.put(pol, json={**GOLD, "min_limit": -1}), 400, "min_limit")
    refused(http.put(pol, json={**GOLD, "min_limit": "1"}), 400, "min_limit")
    refused(http.put(pol, json={**GOLD, "unload_scope": "some"}), 400, "unload_scope")
    refused(http.put(pol, json={**GOLD, "auto_failover": {}}), 400, "auto_failover")
    refused(http.put("/v1/isolation-policies/go ld", json=GOLD), 400, "invalid isolation policy name")
    refused(http.put("/v1/isolation-policies/brokers", json=GOLD), 400, "'brokers' is reserved")
    refused(http.delete(pol + "?unload_scope=every"), 400, "unload_scope")
    assert not zk.exists(paths["isolation"])  # nothing refused was written

    # Create, read back (secondary defaults to empty, min_limit to 1; unload_scope is not stored).
    change = ok(http.put(pol, json=GOLD))
    assert change["policy"] == "gold" and change["previous"] is None and not change["dry_run"]
    stored = {k: GOLD[k] for k in ("namespaces", "primary", "secondary", "min_limit")}
    assert change["current"] == stored
    ok(http.put("/v1/isolation-policies/silver", json={"namespaces": ["std/.*"], "primary": ["b2"]}))
    silver = {"namespaces": ["std/.*"], "primary": ["b2"], "secondary": [], "min_limit": 1}
    assert ok(http.get(pol)) == stored
    assert ok(http.get("/v1/isolation-policies")) == {"gold": stored, "silver": silver}
    assert msgspec.json.decode(zk.get(paths["isolation"])[0]) == {
        "policies": {"gold": stored, "silver": silver}
    }

    # The broker views: live brokers only, primary beats secondary, shared = primary nowhere.
    register(zk, settings, "iso1:8080", "b1:8080", "b2:8080", "b3:8080")
    wait_for(lambda: len(leader.node.ctl.registry.brokers) == 4, message="registry sees the brokers")
    assert ok(http.get("/v1/isolation-policies/brokers")) == [
        {"broker": "b1:8080", "primary_in": [], "secondary_in": ["gold"], "shared": True},
        {"broker": "b2:8080", "primary_in": ["silver"], "secondary_in": [], "shared": False},
        {"broker": "b3:8080", "primary_in": [], "secondary_in": [], "shared": True},
        {"broker": "iso1:8080", "primary_in": ["gold"], "secondary_in": [], "shared": False},
    ]
    assert ok(http.get("/v1/isolation-policies/brokers/iso1:8080")) == {
        "broker": "iso1:8080",
        "primary_in": ["gold"],
        "secondary_in": [],
        "shared": False,
    }
    refused(http.get("/v1/isolation-policies/brokers/iso9:8080"), 404, "iso9:8080 is not a live broker")

    # Delete returns the removed policy.
    gone = ok(http.delete("/v1/isolation-policies/silver"))
    assert gone["previous"] == silver and gone["current"] is None
    assert ok(http.get("/v1/isolation-policies")) == {"gold": stored}
    assert ok(http.get("/v1/isolation-policies/brokers/b2:8080"))["shared"] is True


# ---------------------------------------------------------------------------------------------- unload scopes


def test_isolation_changes_unload_exactly_the_bundles_their_scope_names(leader: Api, zk: KazooClient) -> None:
    http = leader.http
    vip_a, vip_b, gold_x, other_z = (bundles(ns) for ns in ("vip/a", "vip/b", "gold/x", "other/z"))
    everything = vip_a + vip_b + gold_x + other_z
    own(leader, dict.fromkeys(everything, "b1:8080"))
    pol = "/v1/isolation-policies/p"

    def put(body: dict[str, Any], **params: Any) -> Any:
        change = ok(http.put(pol, json=body, params=params))
        unloaded = set(change["unloaded"])
        if not change["dry_run"]:
            wait_for(lambda: releasing(leader) == unloaded, message=f"exactly {sorted(unloaded)} released")
            own(leader, dict.fromkeys(unloaded, "b1:8080"))
        return change

    # none: creating the policy moves nothing.
    c = put({"namespaces": ["vip/a"], "primary": ["iso1"], "unload_scope": "none"})
    assert c["unloaded"] == [] and c["namespaces"] == [] and c["unload_scope"] == "none"

    # changed (the default): only the namespaces of the regexes added or removed.
    c = put({"namespaces": ["vip/a", "vip/b"], "primary": ["iso1"]})
    assert c["unload_scope"] == "changed" and c["namespaces"] == ["vip/b"] and c["unloaded"] == vip_b

    # changed, with only the secondary list and min_limit changed: Pulsar moves nothing.
    c = put({"namespaces": ["vip/a", "vip/b"], "primary": ["iso1"], "secondary": ["b1"], "min_limit": 2})
    assert c["unloaded"] == []

    # changed, one regex swapped for another: the namespaces leaving and joining, not the ones kept.
    c = put({"namespaces": ["vip/a", "gold/.*"], "primary": ["iso1"], "secondary": ["b1"], "min_limit": 2})
    assert c["namespaces"] == ["gold/x", "vip/b"] and c["unloaded"] == sorted(gold_x + vip_b)

    # all_matching: every namespace the old or the new regexes match.
    c = put(
        {
            "namespaces": ["vip/a", "gold/.*"],
            "primary": ["iso1"],
            "secondary": ["b1"],
            "unload_scope": "all_matching",
        }
    )
    assert c["namespaces"] == ["gold/x", "vip/a"] and c["unloaded"] == sorted(gold_x + vip_a)

    # changed, but the primary list changed: everything old or new matches, as all_matching.
    c = put({"namespaces": ["vip/a"], "primary": ["iso2"]})
    assert c["namespaces"] == ["gold/x", "vip/a"] and c["unloaded"] == sorted(gold_x + vip_a)
    assert all(r.state is State.OWNED for k, r in leader.table.items() if k in other_z)  # never matched

    # Delete: its namespaces move (the default), or nothing with unload_scope=none.
    c = ok(http.delete(pol))
    assert c["unloaded"] == vip_a and c["current"] is None
    wait_for(lambda: releasing(leader) == set(vip_a), message="the deleted policy's bundles released")
    own(leader, dict.fromkeys(vip_a, "b1:8080"))
    ok(http.put(pol, json={"namespaces": ["vip/.*"], "primary": ["iso1"], "unload_scope": "none"}))
    c = ok(http.delete(pol, params={"unload_scope": "none"}))
    assert c["unloaded"] == [] and c["previous"]["namespaces"] == ["vip/.*"]
    assert releasing(leader) == set()

    journal = [d for d in leader.admin.journal.recent() if d["kind"].startswith("isolation_policy")]
    assert [d["unloaded"] for d in reversed(journal)] == [0, 2, 0, 4, 4, 4, 2, 0, 0]
    assert leader.node.metric("trimtab_unloads_total", kind="unload", reason="admin") == 16


def test_an_unload_is_a_releasing_without_destination_from_the_owner_under_the_leader_s_term(
    leader: Api,
) -> None:
    vip = bundles("vip/a")
    own(leader, {vip[0]: "b1:8080", vip[1]: "b2:8080"})
    before = {k: r.version for k, r in leader.table.items()}
    c = ok(leader.http.put("/v1/isolation-policies/p", json={"namespaces": ["vip/a"], "primary": ["iso1"]}))
    assert c["unloaded"] == vip and c["failed"] == {}
    wait_for(lambda: releasing(leader) == set(vip), message="released")
    writer = leader.node.ctl.leadership.writer()
    for b, owner in zip(vip, ("b1:8080", "b2:8080"), strict=True):
        r = leader.table.get(b)
        assert r is not None
        assert (r.state, r.src, r.dst, r.version, r.writer) == (
            State.RELEASING,
            owner,
            None,
            before[b] + 1,
            writer,
        )


def test_a_dry_run_reports_the_unloads_and_writes_nothing(
    leader: Api, zk: KazooClient, paths: dict[str, str], settings: Settings, log: MemoryLog, nodes: list[Node]
) -> None:
    http = leader.http
    vip, other = bundles("vip/a"), bundles("other/z")
    own(leader, dict.fromkeys(vip + other, "b1:8080"))
    body = {"namespaces": ["vip/.*"], "primary": ["iso1"]}
    channel_end = len(log.messages(settings.kafka.channel_topic))

    c = ok(http.put("/v1/isolation-policies/p", json=body, params={"dry_run": "true"}))
    assert c["dry_run"] and c["unloaded"] == vip and c["namespaces"] == ["vip/a"] and c["previous"] is None
    assert not zk.exists(paths["isolation"])
    refused(http.delete("/v1/isolation-policies/p", params={"dry_run": "true"}), 404, "no isolation policy")

    ok(http.put("/v1/isolation-policies/p", json={**body, "unload_scope": "none"}))
    _, stat = zk.get(paths["isolation"])
    c = ok(http.delete("/v1/isolation-policies/p", params={"dry_run": "true"}))
    assert c["dry_run"] and c["unloaded"] == vip and c["current"] is None
    c = ok(http.put("/v1/isolation-policies/p", json={**body, "primary": ["iso2"]}, params={"dry_run": "1"}))
    assert c["dry_run"] and c["unloaded"] == vip and c["previous"]["primary"] == ["iso1"]
    assert zk.get(paths["isolation"])[1].version == stat.version  # the znode is untouched
    assert len(log.messages(settings.kafka.channel_topic)) == channel_end  # no record
    assert releasing(leader) == set()
    assert not [d for d in leader.admin.journal.recent() if d["kind"] != "isolation_policy_set"]
    assert leader.node.metric("trimtab_admin_requests_total", op="isolation_policy", result="dry_run") == 3

    # A follower answers a dry run itself (it reads ZooKeeper and its own replica of the channel).
    follower = Node(settings, log).start(elect=False)
    nodes.append(follower)
    with make_api(follower, settings) as f:
        wait_for(lambda: all(f.table.get(b) for b in vip), message="the follower's table caught up")
        c = ok(f.http.delete("/v1/isolation-policies/p", params={"dry_run": "true"}))
        assert c["unloaded"] == vip
    assert zk.get(paths["isolation"])[1].version == stat.version


# ---------------------------------------------------------------------------------------------- followers


def test_a_follower_reads_but_sends_writes_to_the_leader_or_says_there_is_none(
    leader: Api, settings: Settings, log: MemoryLog, nodes: list[Node], zk: KazooClient, paths: dict[str, str]
) -> None:
    ok(leader.http.put("/v1/failure-domains/rack1", json={"brokers": ["b1:8080"]}))

    # A follower that knows the leader redirects every write there (307 keeps the method and body).
    follower = Node(settings, log).start()
    nodes.append(follower)
    wait_for(lambda: follower.ctl.election.leader() is not None, message="the follower knows the leader")
    assert not follower.ctl.leadership.is_leader
    leader_url = leader.node.ctl.election.http_url
    with make_api(follower, settings) as f:
        assert ok(f.http.get("/v1/failure-domains")) == {"rack1": {"brokers": ["b1:8080"]}}
        writes = [
            ("PUT", "/v1/failure-domains/rack2", {"brokers": ["b2:8080"]}),
            ("DELETE", "/v1/failure-domains/rack1", None),
            ("PUT", "/v1/namespaces/acme/orders/anti-affinity", {"group": "g"}),
            ("DELETE", "/v1/namespaces/acme/orders/anti-affinity", None),
            ("PUT", "/v1/isolation-policies/p", {"namespaces": ["a/.*"], "primary": ["x"]}),
            ("DELETE", "/v1/isolation-policies/p", None),
        ]
        for method, path, body in writes:
            r = f.http.request(method, path, json=body)
            assert r.status_code == 307 and r.headers["location"] == leader_url + path, (path, r.status_code)
        # The query goes along: without it the leader would unload with the default scope.
        r = f.http.delete("/v1/isolation-policies/p", params={"unload_scope": "none"})
        assert r.status_code == 307
        assert r.headers["location"] == leader_url + "/v1/isolation-policies/p?unload_scope=none"

    # One that knows no leader: a retryable 503 (no ZooKeeper write either way).
    lone = Node(settings, log).start(elect=False)
    nodes.append(lone)
    with make_api(lone, settings) as f:
        for method, path, body in writes:
            refused(f.http.request(method, path, json=body), 503, "not the leader", retryable=True)
    assert msgspec.json.decode(zk.get(paths["domains"])[0]) == {
        "domains": {"rack1": {"brokers": ["b1:8080"]}}
    }
    assert not zk.exists(paths["groups"]) and not zk.exists(paths["isolation"])


# ---------------------------------------------------------------------------------------------- ZooKeeper trouble


GARBAGE = b'{"domains": not json \xff'


@pytest.mark.parametrize(
    ("kind", "read", "write"),
    [
        ("domains", "/v1/failure-domains", ("PUT", "/v1/failure-domains/rack1", {"brokers": ["b1:8080"]})),
        ("domains", "/v1/failure-domains/rack1", ("DELETE", "/v1/failure-domains/rack1", None)),
        (
            "groups",
            "/v1/anti-affinity/g",
            ("PUT", "/v1/namespaces/acme/orders/anti-affinity", {"group": "g"}),
        ),
        (
            "groups",
            "/v1/namespaces/acme/orders/anti-affinity",
            ("DELETE", "/v1/namespaces/acme/orders/anti-affinity", None),
        ),
        (
            "isolation",
            "/v1/isolation-policies",
            ("PUT", "/v1/isolation-policies/p", {"namespaces": ["a/b"], "primary": ["x"]}),
        ),
        ("isolation", "/v1/isolation-policies/brokers", ("DELETE", "/v1/isolation-policies/p", None)),
    ],
)
def test_an_unreadable_znode_is_reported_by_path_and_never_overwritten(
    leader: Api,
    zk: KazooClient,
    paths: dict[str, str],
    kind: str,
    read: str,
    write: tuple[str, str, Any],
) -> None:
    zk.create(paths[kind], GARBAGE, makepath=True)
    err = refused(leader.http.get(read), 500, paths[kind], "unreadable")
    assert "repair or delete" in err
    method, path, body = write
    refused(leader.http.request(method, path, json=body), 500, paths[kind], "left as it is")
    if kind == "isolation":  # a dry run reads the same znode
        refused(leader.http.request(method, path, json=body, params={"dry_run": "true"}), 500, paths[kind])
    data, stat = zk.get(paths[kind])
    assert data == GARBAGE and stat.version == 0


def test_a_policy_stored_around_the_api_with_a_bad_regex_is_named_by_the_broker_view(
    leader: Api, zk: KazooClient, paths: dict[str, str]
) -> None:
    doc = {"policies": {"bad": {"namespaces": ["a/.*"], "primary": ["("], "secondary": [], "min_limit": 1}}}
    zk.create(paths["isolation"], msgspec.json.encode(doc), makepath=True)
    refused(leader.http.get("/v1/isolation-policies/brokers"), 500, paths["isolation"], "primary[0] '('")
    # It can be replaced (or deleted) through the API.
    ok(leader.http.put("/v1/isolation-policies/bad", json={"namespaces": ["a/.*"], "primary": ["x"]}))
    assert ok(leader.http.get("/v1/isolation-policies/brokers")) == []


class RacingStore(PlacementStore):
    """Another writer changes the znode between every read and write of ours (a real version bump)."""

    def read(self, kind: str) -> tuple[msgspec.Struct, int]:
        doc, version = super().read(kind)
        if version >= 0:
            self.zk.set(self.paths[kind], self.zk.get(self.paths[kind])[0])
        return doc, version


def test_a_write_that_keeps_losing_to_another_writer_is_a_retryable_503(
    leader: Api, settings: Settings, paths: dict[str, str], zk: KazooClient
) -> None:
    ok(leader.http.put("/v1/failure-domains/rack1", json={"brokers": ["b1:8080"]}))
    racing = make_api(
        leader.node, settings, RacingStore(leader.node.ctl.zk.client, ZkPaths(settings.zk_path))
    )
    with racing:
        r = racing.http.put("/v1/failure-domains/rack2", json={"brokers": ["b2:8080"]})
        refused(r, 503, paths["domains"], "try again", retryable=True)
    assert msgspec.json.decode(zk.get(paths["domains"])[0]) == {
        "domains": {"rack1": {"brokers": ["b1:8080"]}}
    }
