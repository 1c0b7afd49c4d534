"""``--no-measure-clocks`` keeps its promise: every clock is taken to agree
with the metadata log's within the grace window, so a controller whose clock
is 1.5 s behind (inside the 2 s grace) raises nothing on a clean history.

The history: the simulator's clean cluster (no fault injected), controller
3000's clock 1.5 s behind, elections forced at 20 s and 40 s, and only the
controllers' request logs (their Vote, BeginQuorumEpoch and metadata-fetch
lines). 3000 claimed epoch 7 by serving a metadata fetch stamped 13.399 s by
its clock (14.9 s true); 3002, the leader of epoch 6, served its last fetch
0.9 s later by the true clock, 2.4 s later by the stamps: taken for a zombie
before (QUORUM_ZOMBIE_LEADER, also at f6ae53e).
"""

from __future__ import annotations

from functools import cache

from detectors.config import DetectorConfig
from detectors.engine import Detector
from detectors.envelope import envelope_from_obj
from producers import shapes as s
from producers.sim_clocks import Failover, parse_clock
from producers.simulator import SimConfig, Simulator


@cache
def _controllers_request_logs() -> tuple[Simulator, list[dict]]:
    sim = Simulator(
        SimConfig(
            seed=1,
            fault_rate=0.0,
            clocks=(parse_clock("3000=-1.5s"),),
            failovers=(Failover(20_000), Failover(40_000)),
        )
    )
    events = [raw for _, raw in sim.timed_events(40_000)]
    return sim, [e for e in events if e["kind"] == "request" and e["node"] >= 3000]


def _alerts(events: list[dict], config: DetectorConfig) -> list[dict]:
    detector = Detector(config, now_ms=lambda: 0)
    ordered = sorted(range(len(events)), key=lambda i: events[i]["ts_ms"])  # as replay merges them
    for i in ordered:
        detector.ingest(envelope_from_obj(events[i], f"sim:{i}", i))
    detector.flush()
    return [a.to_dict() for a in detector.drain()]


def test_a_controller_1_5_s_behind_raises_no_zombie_with_clocks_unmeasured():
    sim, events = _controllers_request_logs()
    assert sim.truth == []
    quorum_apis = {e["body"]["requestHeader"]["requestApiKey"] for e in events}
    assert quorum_apis >= {1, 52, 53}  # Fetch of __cluster_metadata, Vote, BeginQuorumEpoch
    assert _alerts(events, DetectorConfig()) == []


def test_and_none_with_clocks_measured():
    _, events = _controllers_request_logs()
    assert _alerts(events, DetectorConfig(measure_clocks=True)) == []


def test_a_zombie_across_two_clocks_is_still_caught_past_twice_the_grace_window(make_history):
    """The tolerance is one grace window for the act's clock and one for the
    claim's: a leader acting 4.5 s after another node's claim of a newer epoch
    is a zombie whatever the clocks (within the grace window each) did."""
    history = make_history(standard=False)
    history.request(10_000, 3001, s.quorum_fetch(3001, 7, 3002))  # 3001 leads epoch 7
    history.request(4_000, 3000, s.quorum_fetch(3000, 6, 3002))  # 3000 leads epoch 6
    history.request(14_500, 3000, s.quorum_fetch(3000, 6, 3002))  # and still acts 4.5 s after 7's claim
    history.envelopes.sort(key=lambda env: env.ts_ms)
    alerts = [a for a in history.run().alerts if a.rule == "QUORUM_ZOMBIE_LEADER"]
    assert [(a.node, a.ts_ms) for a in alerts] == [(3000, 14_500)]
