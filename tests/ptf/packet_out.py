"""PacketOuts the control plane never sends, handled as PI does on BMv2 (each found by probing
both targets with them): they never reach the pipeline, and the controller's stream survives
them."""

from __future__ import annotations

import time

from common.bml_test import SWITCH, BmlTest

from bml.protocol import CONTROLLER_MAGIC, Stat
from control_plane.aggregation import reset_frames
from control_plane.session import SwitchSession


class MagicWiderThanItsField(BmlTest):
    """A 17-bit value for the 16-bit magic: dropped before the pipeline (nothing counted; the
    software target used to let it end the stream), and the next PacketOut on the same stream
    works. A padded value that fits (a leading zero byte) is accepted."""

    def runTest(self) -> None:  # noqa: N802
        group = self.add_job(7, [1, 2])
        reset = reset_frames(SWITCH, group, self.wire)[0]
        before = self.counters()
        self.packet_out_raw(self.session, reset, ((1 << 16) | CONTROLLER_MAGIC).to_bytes(3, "big"))
        self.packet_out_raw(self.session, reset, CONTROLLER_MAGIC.to_bytes(3, "big"))
        self.assert_counted(before, {Stat.RESET: 1})


class PacketOutFromBackupDropped(BmlTest):
    """Once another controller is primary, this session is a backup: its PacketOut is dropped
    (the software target used to send it through). Primary again once the other one leaves."""

    def runTest(self) -> None:  # noqa: N802
        group = self.add_job(7, [1, 2])
        reset = reset_frames(SWITCH, group, self.wire)[0]
        other = SwitchSession("dut-other", self.session.address, self.session.device_id,
                              (0, 9))
        try:
            before = self.counters()
            self.session.packet_out(reset)
            time.sleep(0.5)
            self.assert_counted(before)
        finally:
            other.close()
        deadline = time.monotonic() + 3
        while self.stat(Stat.RESET) == before[0][Stat.RESET] and time.monotonic() < deadline:
            self.session.packet_out(reset)  # the server notices the other stream end soon
            time.sleep(0.2)
        self.assertGreater(self.stat(Stat.RESET), before[0][Stat.RESET])
