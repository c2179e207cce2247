"""Failure paths of the control plane against an in-process fake P4Runtime server."""

from __future__ import annotations

import queue
import socket
import time
from concurrent import futures

import grpc
import pytest
from google.rpc import code_pb2, status_pb2
from p4.v1 import p4runtime_pb2, p4runtime_pb2_grpc

from control_plane.session import SwitchSession, SwitchUnreachable


class FakeSwitch(p4runtime_pb2_grpc.P4RuntimeServicer):
    """Answers arbitration as primary; refuses every table write as PI would."""

    def __init__(self, refuse: str = "ALREADY_EXISTS") -> None:
        self.refuse = refuse
        self.writes: list[p4runtime_pb2.WriteRequest] = []

    def StreamChannel(self, request_iterator, context):  # noqa: N802
        answers: queue.Queue = queue.Queue()

        def read() -> None:
            for request in request_iterator:
                if request.HasField("arbitration"):
                    reply = p4runtime_pb2.StreamMessageResponse()
                    reply.arbitration.CopyFrom(request.arbitration)
                    reply.arbitration.status.code = code_pb2.OK
                    answers.put(reply)
            answers.put(None)

        futures.ThreadPoolExecutor(1).submit(read)
        while (message := answers.get()) is not None:
            yield message

    def Write(self, request, context):  # noqa: N802
        self.writes.append(request)
        status = status_pb2.Status(code=code_pb2.UNKNOWN, message="write failed")
        for index, _ in enumerate(request.updates):
            code = getattr(code_pb2, self.refuse) if index == len(request.updates) - 1 else 0
            status.details.add().Pack(p4runtime_pb2.Error(
                canonical_code=code, message="entry exists" if code else ""))
        context.set_trailing_metadata((("grpc-status-details-bin",
                                        status.SerializeToString()),))
        context.set_code(grpc.StatusCode.UNKNOWN)
        context.set_details("write failed")
        return p4runtime_pb2.WriteResponse()


@pytest.fixture
def fake_switch():
    servicer = FakeSwitch()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    p4runtime_pb2_grpc.add_P4RuntimeServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    servicer.server = server
    yield servicer, f"127.0.0.1:{port}"
    server.stop(0)


def unused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_unreachable_switch_is_a_clear_bounded_error():
    address = f"127.0.0.1:{unused_port()}"
    started = time.monotonic()
    with pytest.raises(SwitchUnreachable) as error:
        SwitchSession("s1_2", address, timeout=1.0)
    assert time.monotonic() - started < 3.0
    assert "s1_2" in str(error.value) and address in str(error.value)
