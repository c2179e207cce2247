"""The software target's P4Runtime server, in process: what it accepts and how it refuses."""

from __future__ import annotations

import grpc
import pytest
from p4.v1 import p4runtime_pb2

from bml.frames import aggregation_frame
from bml.protocol import BUILT_LANES, DEFAULT_LANES, STATS_SIZE, DropReason, Stat, wire
from control_plane.p4info import Names, built_device_config, built_p4info
from control_plane.session import SwitchError, SwitchSession, entry
from soft_target.admission import JobConfig
from soft_target.p4runtime_server import serve
from soft_target.pipeline import Pipeline
from tests.conftest import in_process_servicer


@pytest.fixture
def soft_switch():
    pipeline = Pipeline()
    server, port = serve(in_process_servicer(pipeline), "127.0.0.1:0")
    session = SwitchSession("soft", f"127.0.0.1:{port}", 1, (0, 1), timeout=3)
    yield pipeline, session
    session.close()
    server.stop(0)


def test_pipeline_push_then_entries_reach_the_pipeline(soft_switch):
    pipeline, session = soft_switch
    assert session.push_pipeline() is True
    assert session.push_pipeline() is False  # already running: not pushed again
    session.write_entries([entry(Names.L2_FORWARD, {"hdr.ethernet.dstAddr": 0x020000000001},
                                 Names.FORWARD_TO, port=3)])
    assert pipeline.tables.l2_forward == {bytes.fromhex("020000000001"): 3}
    assert len(session.read_table(Names.L2_FORWARD)) == 1
    session.set_multicast_group(5, [1, 2, 4])
    assert pipeline.tables.mcast_groups == {5: (1, 2, 4)}
    session.write_entries([entry(Names.L2_FORWARD, {"hdr.ethernet.dstAddr": 0x020000000001},
                                 Names.FORWARD_TO, port=3)], kind="DELETE")
    assert pipeline.tables.l2_forward == {}


def test_refusals_are_per_entry_and_name_the_switch(soft_switch):
    _, session = soft_switch
    session.push_pipeline()
    item = entry(Names.WORKER_ADMISSION, {"hdr.bml.job_id": 1, "hdr.bml.worker_id": 0},
                 Names.ADMIT, port=1)
    session.write_entries([item])
    with pytest.raises(SwitchError, match=r"(?s)switch soft refused 1 of 1 writes.*already exists"):
        session.write_entries([item])
    missing = entry(Names.JOB_CONFIG, {"hdr.bml.job_id": 9}, Names.SET_JOB, pool_base=0,
                    pool_size=1, num_workers=1, result_mode=0, mcast_grp=1)
    with pytest.raises(SwitchError, match="does not exist"):
        session.write_entries([missing], kind="MODIFY")


def test_only_the_built_pipeline_is_accepted(soft_switch):
    _, session = soft_switch
    request = p4runtime_pb2.SetForwardingPipelineConfigRequest(device_id=1)
    request.election_id.low = 1
    request.action = p4runtime_pb2.SetForwardingPipelineConfigRequest.VERIFY_AND_COMMIT
    request.config.p4info.CopyFrom(built_p4info().message)
    request.config.p4info.tables[0].preamble.name = "Someone.else"
    request.config.p4_device_config = b"{}"
    with pytest.raises(grpc.RpcError) as error:
        session.client.stub.SetForwardingPipelineConfig(request)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "runs only the BML-INA pipeline" in error.value.details()


def set_pipeline(session: SwitchSession, p4info, device_config: bytes,
                 action: int = p4runtime_pb2.SetForwardingPipelineConfigRequest.VERIFY_AND_COMMIT
                 ) -> None:
    request = p4runtime_pb2.SetForwardingPipelineConfigRequest(device_id=1, action=action)
    request.election_id.low = 1
    request.config.p4info.CopyFrom(p4info)
    request.config.p4_device_config = device_config
    session.client.stub.SetForwardingPipelineConfig(request)


def test_every_built_width_is_accepted_and_sets_the_pipelines(soft_switch):
    """The pipeline takes the width of the build it is given, each time it is given one."""
    pipeline, session = soft_switch
    for lanes in (*reversed(BUILT_LANES), DEFAULT_LANES):
        set_pipeline(session, built_p4info(lanes).message, built_device_config(lanes))
        assert pipeline.lanes == lanes and pipeline.sums.shape[1] == lanes
        assert session.running_lanes() == lanes
        if len(built_device_config(lanes)) > 4 << 20:
            continue  # more than gRPC's default for a client to receive
        kinds = p4runtime_pb2.GetForwardingPipelineConfigRequest
        reply = session.client.stub.GetForwardingPipelineConfig(
            kinds(device_id=1, response_type=kinds.DEVICE_CONFIG_AND_COOKIE))
        assert reply.config.p4_device_config == built_device_config(lanes)


def test_a_config_mixing_two_widths_is_refused(soft_switch):
    pipeline, session = soft_switch
    wide = BUILT_LANES[-1]
    for p4info, device_config, says in (
            (built_p4info(DEFAULT_LANES).message, built_device_config(wide), "device config"),
            (built_p4info(wide).message, built_device_config(DEFAULT_LANES), "device config")):
        with pytest.raises(grpc.RpcError) as error:
            set_pipeline(session, p4info, device_config)
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert says in error.value.details()
    odd = type(built_p4info(DEFAULT_LANES).message)()
    odd.CopyFrom(built_p4info(DEFAULT_LANES).message)
    del odd.registers[-1]
    with pytest.raises(grpc.RpcError) as error:
        set_pipeline(session, odd, built_device_config(DEFAULT_LANES))
    assert "lane registers" in error.value.details()
    assert pipeline.lanes == DEFAULT_LANES


def test_a_pipeline_set_to_a_width_refuses_the_others(soft_switch):
    """After the 256-lane build is set, a 64-lane contribution is BAD_WIDTH and a 256-lane
    one is aggregated (a one-worker job completes at once)."""
    pipeline, session = soft_switch
    set_pipeline(session, built_p4info(256).message, built_device_config(256))
    pipeline.tables.job_config = {1: JobConfig(0, 4, 1, 0, 1)}
    pipeline.tables.worker_admission = {(1, 0): 1}
    narrow = aggregation_frame(1, 1, 0, 0, 0, 0, [1] * DEFAULT_LANES)
    assert pipeline.process(1, narrow) == []
    assert pipeline.drops[DropReason.BAD_WIDTH] == 1
    wide = aggregation_frame(1, 1, 0, 0, 0, 0, [1] * 256)
    assert len(wide) == wire(256).frame_bytes
    pipeline.process(1, wide)
    assert pipeline.stats[Stat.COMPLETED] == 1


def test_writes_before_a_pipeline_and_register_reads_are_refused(soft_switch):
    _, session = soft_switch
    with pytest.raises(SwitchError, match="no forwarding pipeline config"):
        session.write_entries([entry(Names.L2_FORWARD, {"hdr.ethernet.dstAddr": 1},
                                     Names.FORWARD_TO, port=1)])
    session.push_pipeline()
    entity = p4runtime_pb2.Entity()
    entity.register_entry.register_id = 1
    with pytest.raises(SwitchError, match="UNIMPLEMENTED"):
        session._read(entity)


def test_counters_read_as_written_by_the_pipeline(soft_switch):
    pipeline, session = soft_switch
    session.push_pipeline()
    pipeline.stats[1] = 42
    pipeline.drops[3] = 7
    assert session.read_counter(Names.STATS)[1] == 42
    assert session.read_counter(Names.DROPS)[3] == 7


def test_an_election_id_in_use_is_refused_and_readers_need_none(soft_switch):
    _, session = soft_switch
    address = session.address
    with pytest.raises(SwitchError, match=r"election id \(0, 1\) already held"):
        SwitchSession("soft", address, 1, (0, 1), timeout=3)
    session.push_pipeline()
    readers = [SwitchSession("soft", address, 1, timeout=3, stream=False) for _ in range(2)]
    try:
        assert all(len(r.read_counter(Names.STATS)) == STATS_SIZE for r in readers)
    finally:
        for reader in readers:
            reader.close()
