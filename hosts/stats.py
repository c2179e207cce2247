"""What one allreduce call did: the one stats type of every executor."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Replan:
    """One re-planning inside a call: what failed, and how long the call took to go on."""

    cause: str
    schedule: list[str]  # the degraded schedule's description
    gave_up_at: float  # when this worker gave up on the failed plan
    resumed_at: float = 0.0  # ... and when the new plan gave it its first whole block

    @property
    def recovery_seconds(self) -> float:
        return self.resumed_at - self.gave_up_at


@dataclass
class CallStats:
    seconds: float = 0.0
    frames_sent: int = 0
    retransmissions: int = 0  # frames sent again
    probes: int = 0  # header-only PROBEs: is my contribution in?
    pending: int = 0  # slots the switch answered PENDING (contribution already in)
    # Frames sent again by why: a frame sent after it was answered (RACK), no answer at all
    # for a timeout (stalled), a PENDING slot's fallback, a probe answered MISSING.
    resent: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(("ordered", "stalled", "pending", "missing"), 0))
    broadcasts: int = 0
    repairs_asked: int = 0
    salvaged: int = 0  # blocks asked of a neighbour that held the whole sum (a failure's tail)
    stream_bytes: int = 0
    exponent_seconds: float = 0.0
    first_result: float = 0.0  # time of the first whole block
    last_result: float = 0.0  # ... and of the last: the rest of the call is the ending
    replans: list[Replan] = field(default_factory=list)
    # A failure seen once every block's sum existed: the call returned the sum all the same
    # (docs/PROTOCOL.md, "A failure at the end"), and the next call re-plans around it.
    failure_after_sum: str = ""
    gone: list[int] = field(default_factory=list)  # neighbours that fell silent at the end
    attempt_seconds: float = 0.0  # the last attempt alone (after a re-planning: the new plan)
