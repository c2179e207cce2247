"""The deterministic simulator: the real engine and switch pipeline through seeded faults.

Each trial is a call with one fault at any moment (its start, its middle, its last packets),
then a second run on the same job; ``simulation.world.run_trial`` checks that no worker
returns a wrong sum, that every survivor ends before its deadline, that a fault leaving a way
on is re-planned around, and that the next run is right. A failure names the command that
replays it (``bml-sim run --seed ...``). ``make sim-soak`` runs 20,000 trials.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from bml.protocol import WIDEST_LANES
from hosts.quantize import ExpectedSum
from hosts.recovery import START_DEADLINE
from simulation import cli as sim_cli
from simulation.world import (
    Fault,
    Scenario,
    World,
    failover_gst,
    gradients,
    run_seed,
    run_trial,
    simulated_gst,
    wrong_sum,
)

# 510 seeded trials in CI, spread over the sizes the emulation also runs.
SOAK = [("bcube:2,2", 200), ("star:4", 150), ("bcube:3,2", 100), ("bcube:2,3", 60)]
WIDE_FLOATS = 40 * WIDEST_LANES  # 40 packets per server at the widest build


@pytest.mark.parametrize(("topo", "seeds"), SOAK)
def test_seeded_faults_never_give_a_wrong_sum_a_hang_or_an_unusable_job(topo, seeds):
    failures = []
    for seed in range(seeds):
        verdict = run_seed(seed, topo)
        if not verdict.ok:
            failures.append(f"{verdict.scenario.command()}: {verdict.problems[0][:400]}")
    assert not failures, "\n".join(failures)


def test_seeded_faults_at_the_widest_build_too():
    """The same trials with every switch on the widest build (2,208 values per packet)."""
    failures = []
    for seed in range(40):
        verdict = run_seed(seed, "bcube:3,2" if seed % 2 else "bcube:2,2", floats=WIDE_FLOATS,
                           lanes=WIDEST_LANES)
        if not verdict.ok:
            failures.append(f"{verdict.scenario.command()}: {verdict.problems[0][:400]}")
    assert not failures, "\n".join(failures)


def test_a_seed_replays_exactly():
    first, again = run_seed(11, "bcube:3,2"), run_seed(11, "bcube:3,2")
    assert first.scenario.faults == again.scenario.faults
    assert first.first_call == again.first_call
    assert first.gst == again.gst


def test_a_link_failing_as_a_neighbour_finishes_leaves_nobody_waiting_for_it():
    """Found by ``bml-sim soak --lanes 2208``: h1's level-1 link fails 2 ms into a 2-block
    call, after server 1 has sent what it owes but before it arrives. Servers 0 and 1 hold
    the sum and return it; server 3 asks server 2 (which said DONE) for the block that never
    came, and neither waits for server 1, whose DONE cannot come."""
    verdict = run_seed(5265, "bcube:2,2", "mixed", floats=4096, rate=100e6,
                       lanes=WIDEST_LANES)
    assert verdict.ok, verdict.problems
    assert set(verdict.first_call.values()) == {"ok"}, verdict.first_call
    assert verdict.gst < 5.0  # a detection time or two, not the 30 s timeout


def test_a_lost_abort_is_re_sent_before_the_neighbours_holding_the_sum_return_it():
    """Found by ``bml-sim soak --loss 0.02``: h0's level-0 link fails 2 ms into a host-based
    call, when servers 1 and 3 already hold the sum. Server 0 finds its switch silent after
    1.5 s and re-runs the call; its ABORT to server 2 was lost and, with nothing behind it,
    re-sent after TCP's 200 ms, by when servers 1 and 3 had returned the sum: servers 0 and 2
    waited 10 s for them in the re-run. With a HERE behind the ABORT it is re-sent within a
    round trip and all four re-run."""
    verdict = run_seed(90040, "bcube:2,2", "host-based", floats=4096, rate=100e6, loss=0.02)
    assert verdict.ok, verdict.problems
    assert verdict.gst < 5.0


@pytest.mark.parametrize(("seed", "topo", "schedule"), [
    (400087, "bcube:2,3", "mixed"), (400219, "bcube:2,3", "mixed"),
    (400273, "bcube:2,3", "mixed"), (400369, "bcube:2,3", "in-network"),
    (401497, "bcube:2,3", "mixed")])
def test_a_switch_failing_as_the_mesh_is_made_is_planned_around(seed, topo, schedule):
    """Found by ``bml-sim soak`` once the simulator made the mesh with the engine's connect
    phase: a switch that answered the mesh's first question round dies (or dies and comes
    back) while the greetings are on their way. It was found only at the start timeout, and
    a dialler waited for an answer lost with it until its deadline (401497: a mesh that had
    planned around every level it missed never failed, and hung); now the questions go on
    round after round while neighbours are missing, and a greeting unanswered for
    ``GREETING_WAIT`` is dialled again."""
    verdict = run_seed(seed, topo, schedule)
    assert verdict.ok, verdict.problems


def test_a_switch_failing_once_some_workers_hold_the_sum_ends_the_call_with_it_everywhere():
    """Found by ``bml-sim soak --lanes 2208``: s1_2 dies 2 ms into a 2-block call, when
    servers 0-2 already hold the whole sum (and return it). A re-run would need them, so
    servers 2, 5 and 8, cut off from their level-1 switch, ask a neighbour that said DONE for
    the blocks instead, and everyone returns the same sum."""
    verdict = run_seed(5038, "bcube:3,2", "in-network", floats=4096, rate=100e6,
                       lanes=WIDEST_LANES)
    assert verdict.ok, verdict.problems
    assert set(verdict.first_call.values()) == {"ok"}, verdict.first_call


def trial(topo: str, schedule: str, *faults: Fault, floats: int = 4096) -> Scenario:
    return Scenario(topo, schedule, floats, faults=list(faults), seed=7)


@pytest.mark.parametrize("schedule", ["in-network", "mixed", "host-based"])
def test_a_switch_killed_mid_call_on_bcube_3_2_is_re_planned_and_the_sums_are_right(schedule):
    """The failure the emulation hung on: s0_1 killed while every server pushes on all NICs
    (here mid-way through the exponent exchange and the first steps)."""
    verdict = run_trial(trial("bcube:3,2", schedule, Fault("switch", 0.0005, "s0_1"),
                              floats=16384))
    assert verdict.ok, verdict.problems
    assert set(verdict.first_call.values()) == {"ok"}


def test_a_switch_already_down_when_a_call_starts_is_planned_around():
    """s1_2 dies as the call starts, its mesh made: its servers ask it for the job's
    generation, the other switches answer, it stays silent for ``START_DEADLINE``."""
    verdict = run_trial(trial("bcube:3,2", "in-network", Fault("switch", 0.0, "s1_2")))
    assert set(verdict.first_call.values()) == {"ok"}, verdict.first_call
    assert verdict.gst > START_DEADLINE  # found by its silence, then the call ran around it
    assert verdict.gst < Scenario().start_timeout  # not once the start timeout had passed


def every_sum_right(world: World, scenario: Scenario, seed: int, ends_before: float) -> dict:
    """Every worker of ``world`` pushes from a fresh process (its mesh made in the call) and
    returns the right sum before ``ends_before``; returns the workers."""
    grads = gradients(np.random.default_rng(seed), world.topology.num_servers, scenario.floats)
    workers = world.call(grads, [], 60.0)
    expected = ExpectedSum(grads, scenario.lanes)
    for home, worker in workers.items():
        assert worker.outcome is not None and worker.outcome.error is None, (home, worker.state)
        assert wrong_sum(worker.outcome.result, expected) is None
        assert worker.outcome.ended < ends_before  # not at the start timeout
    return workers


def test_a_switch_down_before_the_workers_connect_is_planned_around_within_seconds():
    """s1_2 is down before the processes start: its servers cannot connect on level 1; they
    asked it as their mesh began, find it silent ``START_DEADLINE`` later, and connect over
    the detour; every sum is right long before the start timeout."""
    scenario = trial("bcube:3,2", "in-network")
    world = World(scenario)
    world.network.kill_switch("s1_2")
    workers = every_sum_right(world, scenario, 1, ends_before=scenario.start_timeout)
    group = [workers[s] for s in (2, 5, 8)]  # s1_2's servers re-planned while connecting
    assert all("while the mesh was made" in w.replans[0].cause for w in group)
    assert all(START_DEADLINE <= w.replans[0].gave_up_at < START_DEADLINE + 0.1 for w in group), \
        [w.replans[0].gave_up_at for w in group]


@pytest.mark.parametrize("server", [0, 1])
def test_a_nic_down_before_the_workers_connect_is_planned_around_by_both_ends(server):
    """bcube:2,2, one end's link to s0_0 (servers 0 and 1) down before the processes start:
    only that server sees its switch silent. Whichever end it is (0 dials, 1 accepts), the
    greeting makes the other plan the same detour (server 0's direct dial unanswered, its
    next goes around; or server 0 dials around and says so), and every sum is right long
    before the start timeout."""
    scenario = trial("bcube:2,2", "in-network")
    world = World(scenario)
    world.network.set_link(server, 0, up=False)
    workers = every_sum_right(world, scenario, 2, ends_before=START_DEADLINE + 1.5)
    other = 1 - server
    assert "did not answer while the mesh was made" in workers[server].replans[0].cause
    assert f"gone around by server {server}" in workers[other].replans[0].cause


def test_every_exponents_and_done_message_is_followed_by_a_here(monkeypatch):
    """A call's EXPONENTS and DONE are the last thing on their connections for a while, so a
    lost one would wait for a TCP timeout (the exchange's, lengthened by the queues of the
    others' first windows, held a whole call by 200 ms in the emulation); each is followed
    by a HERE, whose SACK lets the sender's TCP (RACK) re-send it within a round trip. The
    real code, in the simulator: every connection's EXPONENTS and DONE, then a HERE."""
    from hosts.call import Call
    from hosts.mesh import Kind, decode_message

    sent: dict[tuple[int, tuple[int, int]], list[int]] = {}
    take = Call.take_messages

    def recording(call: Call) -> list:
        messages = take(call)
        for key, message in messages:
            sent.setdefault((call.plan.server, key), []).append(decode_message(message)[0])
        return messages

    monkeypatch.setattr(Call, "take_messages", recording)
    scenario = trial("bcube:2,2", "in-network")
    world = World(scenario)
    grads = gradients(np.random.default_rng(3), 4, scenario.floats)
    assert all(w.outcome.error is None for w in world.call(grads, [], 60.0).values())
    for connection, kinds in sent.items():
        for kind in (Kind.EXPONENTS, Kind.DONE):
            assert kind in kinds, (connection, kinds)
            at = kinds.index(kind)
            assert kinds[at + 1] == Kind.HERE, (connection, kinds)


@pytest.mark.parametrize(("topo", "schedule", "target"), [
    ("bcube:2,2", "host-based", "the sender's own"),
    ("bcube:3,2", "mixed", "the receiver's through its switch"),
])
def test_a_contribution_for_blocks_the_receiver_does_not_reduce_is_ignored(
        monkeypatch, topo, schedule, target):
    """A neighbour's CONTRIB names the blocks it is for; only the receiver's host part of
    that step is summed there. One for other blocks (a forged or misrouted message: here
    every CONTRIB is followed by a copy naming another server's blocks, or the receiver's
    own that go through its switch, half of each part on bcube:3,2 mixed) would complete
    those blocks with the wrong values and end in a wrong sum; it is ignored."""
    from hosts.call import Call
    from hosts.mesh import Kind, decode_message, encode_message

    take = Call.take_messages
    forged = []

    def forging(call: Call) -> list:
        messages = take(call)
        for key, message in list(messages):
            kind, tag, stripe, step, _start, count, payload = decode_message(message)
            if kind != Kind.CONTRIB:
                continue
            dim = call.rs_dims[stripe][step]
            parts = call.layout.rs_parts(stripe, step, call.plan.server)
            if target == "the sender's own":
                blocks = parts[call.me[dim]][1]
            else:
                blocks = parts[call.topology.digits(key[1])[dim]][0]
            if blocks[1] - blocks[0] >= count:
                forged.append(key)
                messages.append((key, encode_message(kind, tag, stripe, step, blocks[0],
                                                     count, payload)))
        return messages

    monkeypatch.setattr(Call, "take_messages", forging)
    scenario = trial(topo, schedule)
    world = World(scenario)
    servers = world.topology.num_servers
    grads = gradients(np.random.default_rng(5), servers, scenario.floats)
    outcomes = world.call(grads, [], 60.0)
    assert forged
    expected = ExpectedSum(grads, scenario.lanes)
    for server, worker in outcomes.items():
        assert worker.outcome.error is None, (server, worker.outcome.error)
        assert wrong_sum(worker.outcome.result, expected) is None, server


def test_a_nic_down_mid_call_is_re_planned_over_the_detour():
    verdict = run_trial(trial("bcube:2,2", "mixed", Fault("link", 0.0005, "h2:1")))
    assert verdict.ok, verdict.problems
    assert set(verdict.first_call.values()) == {"ok"}


def test_a_killed_worker_ends_the_call_with_its_name_and_the_next_run_works():
    verdict = run_trial(trial("bcube:2,2", "in-network", Fault("worker-killed", 0.0005, "h2")))
    assert verdict.ok, verdict.problems  # includes: the next run's sums are right
    errors = [end for server, end in verdict.first_call.items() if server != 2]
    assert errors and all("server 2" in end or end == "ok" for end in errors), errors


def test_the_controller_dying_mid_call_changes_nothing():
    verdict = run_trial(trial("bcube:2,2", "in-network", Fault("controller", 0.0005,
                                                               "controller")))
    assert verdict.ok and set(verdict.first_call.values()) == {"ok"}


def test_frames_with_garbled_addresses_are_dropped_and_re_sent():
    verdict = run_trial(trial("star:4", "in-network", Fault("garbled", 0.0002, "h1:0")))
    assert verdict.ok and set(verdict.first_call.values()) == {"ok"}


@pytest.mark.parametrize("schedule", ["in-network", "mixed", "host-based"])
def test_simulated_gst_is_the_cost_models_on_the_links_it_prices(schedule):
    """``bml-sim gst``: a whole fault-free call of every server in virtual time puts within
    a few percent of the predicted bytes on the busiest NIC each way, and takes within 15%
    of the predicted GST (the model prices wire bytes only: no pipeline fill, no turns)."""
    run = simulated_gst("bcube:2,2", schedule, 200_000, 100e6)
    assert run.correct
    up, down = run.busiest
    assert up == pytest.approx(run.prediction.max_up, rel=0.03)
    assert down == pytest.approx(run.prediction.max_down, rel=0.03)
    assert run.gst == pytest.approx(run.prediction.gst, rel=0.15)


@pytest.mark.parametrize("topo", ["star:4", "bcube:3,2"])
def test_wide_frames_on_fast_links_keep_the_queue_bound_and_the_models_pace(topo):
    """At the widest build a channel keeps ~28 frames in flight (what the link's queue
    holds). Frames a worker sends in one go share their send time, yet only the ones before
    an answered frame have left the queue: the bound holds, nothing is tail-dropped and
    re-sent, and a call on 10 Gbit/s links runs at the model's pace."""
    run = simulated_gst(topo, "in-network", 1 << 20, 10e9, lanes=WIDEST_LANES)
    assert run.correct
    up, down = run.busiest
    assert up == pytest.approx(run.prediction.max_up, rel=0.005)
    assert down == pytest.approx(run.prediction.max_down, rel=0.005)
    assert run.gst == pytest.approx(run.prediction.gst, rel=0.15)


def test_streams_are_paced_as_the_mesh_paces_them_so_a_slow_link_drops_no_frame():
    """On slow links the mixed schedule's NICs carry the mesh's streams and the aggregation
    frames in one queue. The simulated connections keep as much unacknowledged as
    ``hosts.mesh`` lets its sockets keep (``connection_limit``): the queue never overflows,
    so no frame is dropped and re-sent, and the bytes are the model's."""
    run = simulated_gst("bcube:3,2", "mixed", 256 * 1024, 2e6)
    assert run.correct
    up, down = run.busiest
    assert up == pytest.approx(run.prediction.max_up, rel=0.005)
    assert down == pytest.approx(run.prediction.max_down, rel=0.005)


def test_bml_sim_gst_prints_one_json_row_per_schedule_for_the_scale_benchmark(capsys):
    """``bml-sim gst --json``: what ``benchmarks/scale.py`` reads from each process."""
    assert sim_cli.main(["gst", "--topo", "bcube:2,2", "--floats", "8K", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [row["schedule"] for row in rows] == ["in-network", "host-based", "mixed"]
    for row in rows:
        assert row["correct"] and row["gst"] > 0 and row["model_gst"] > 0
        assert row["max_up"] == pytest.approx(row["model_up"], rel=0.05)
        assert row["peak_mb"] > 0


@pytest.mark.parametrize("schedule", ["in-network", "mixed", "host-based"])
def test_a_switch_killed_half_way_is_detected_and_the_degraded_plan_runs_at_the_models_pace(
        schedule):
    """``bml-sim gst --fail``: s0_0 of bcube:2,2 killed half-way through a call. Every worker
    re-plans and returns the right sum; the switch is found down within a second of silence
    and question (one and a half on a NIC that sends it no slots, host-based, whose signs of
    life are the streams it forwards), and the degraded plan's
    attempt takes the cost model's GST of the degraded schedule plus the fixed costs a short
    call shows (its fault-free call is within 15% of the model, above)."""
    run = failover_gst("bcube:2,2", schedule, 100_000, 100e6, "s0_0", 0.5)
    assert run.correct
    assert run.replanned == 4
    assert run.detection < (1.7 if schedule == "host-based" else 1.2)
    assert run.detection < run.recovery < run.detection + 0.5
    assert run.predicted <= run.degraded_gst < 1.6 * run.predicted


def test_a_soak_on_two_processes_counts_what_one_does(capsys):
    """``bml-sim soak --jobs``: every trial is its own seeded world, so spreading them over
    processes changes the wall time, not the counts."""
    tables = []
    for jobs in (1, 2):
        code = sim_cli.soak(12, 700, ["bcube:2,2", "star:4"], 4096, 100e6, 0.0,
                            sim_cli.FAULT_KINDS, quiet=True, jobs=jobs)
        assert code == 0
        lines = capsys.readouterr().out.splitlines()
        assert lines[-1].endswith(f"on {jobs} process(es): 0 failed"), lines[-1]
        tables.append(lines[:-1])
    assert tables[0] == tables[1] and len(tables[0]) > 2
