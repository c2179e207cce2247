"""The software target's P4Runtime server, in process: what it accepts and how it refuses."""

from __future__ import annotations

import grpc
import pytest
from p4.v1 import p4runtime_pb2

from bml.protocol import STATS_SIZE
from control_plane.p4info import Names, built_p4info
from control_plane.session import SwitchError, SwitchSession, entry
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
