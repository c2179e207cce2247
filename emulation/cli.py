"""``bml-net``: bring an emulated BCube or star up on this machine, look at it, tear it down.

The command line of ``emulation.net``: it parses, calls that module's functions and prints
what they did; an error the user can act on is one line and exit status 2.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

from bml.paths import DEFAULT_EMULATION
from bml.protocol import BUILT_LANES, DEFAULT_LANES
from bml.topology import TopologyError
from emulation import net
from emulation.netns import NetError, Shaping
from emulation.state import State


def add_shaping_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rate", help="rate per link and direction (tc tbf), e.g. 100mbit")
    parser.add_argument("--delay", help="delay per direction (tc netem), e.g. 1ms")
    parser.add_argument("--loss", type=float, default=0.0,
                        help="loss in percent per direction (nftables)")
    parser.add_argument("--reorder", type=float, default=0.0,
                        help="percent of each server's packets sent through a slower detour, "
                             "so they arrive after later ones (nftables + tbf)")


def describe_shaping(shaping: Shaping) -> str:
    parts = [f"rate {shaping.rate}" if shaping.rate else "",
             f"delay {shaping.delay}" if shaping.delay else "",
             f"loss {shaping.loss:g}%" if shaping.loss else "",
             f"reorder {shaping.reorder:g}%" if shaping.reorder else ""]
    return ", ".join(p for p in parts if p) or "unimpaired (no rate limit, delay, loss or " \
        "reordering)"


def exec_in(state: State, server: str, command: list[str]) -> int:
    """``bml-net exec``: run a command in a server's namespace; its exit status."""
    index = state.server_index(server)
    if not command:
        raise NetError("nothing to run: bml-net exec SERVER -- CMD ...")
    return subprocess.call(["ip", "netns", "exec", state.namespace_of(index), *command])


def inject(state: State, args: argparse.Namespace) -> str:
    """``bml-net fail|restore switch|link|controller``: do it, say what was done."""
    if not state.ready:
        raise NetError(f"emulation {state.name} is not up (still coming up, or failed to)")
    if args.command == "fail" and args.what == "switch":
        pid = net.fail_switch(state, args.switch)
        return (f"bml-net: switch {args.switch} failed: pid {pid} killed (SIGKILL); "
                f"`bml-net restore switch {args.switch}` starts it again")
    if args.what == "switch":
        started = time.monotonic()
        pid = net.restore_switch(state, args.switch, args.bmv2)
        return (f"bml-net: switch {args.switch} restored: pid {pid}, P4Runtime at "
                f"{state.switches[args.switch]['address']} answering after "
                f"{time.monotonic() - started:.1f} s, no pipeline yet (the health monitor "
                "re-provisions it)")
    if args.command == "fail" and args.what == "link":
        key = net.fail_link(state, args.server, args.interface, args.end)
        return f"bml-net: link {key} down ({args.end} end)"
    if args.what == "link":
        key = net.restore_link(state, args.server, args.interface)
        return f"bml-net: link {key} up again, its static neighbours restored"
    if args.command == "fail":
        pid = net.fail_controller(state)
        return (f"bml-net: controller failed: health monitor pid {pid} killed (SIGKILL); "
                "installed jobs keep running on the switches")
    pid = net.restore_controller(state)
    return (f"bml-net: controller restored: health monitor pid {pid}, attached to the running "
            "switches without resetting them")


def parser() -> argparse.ArgumentParser:
    """Every command and option of ``bml-net``."""
    parser = argparse.ArgumentParser(prog="bml-net", description=__doc__.split("\n")[0])
    parser.add_argument("--name", default=DEFAULT_EMULATION,
                        help=f"emulation name (1-6 chars; default {DEFAULT_EMULATION})")
    commands = parser.add_subparsers(dest="command", required=True)
    p_up = commands.add_parser("up", help="create namespaces, links, switches; provision")
    p_up.add_argument("--topo", required=True, help="star:N or bcube:n,k")
    p_up.add_argument("--target", default="soft", help="soft (default) or bmv2")
    p_up.add_argument("--bmv2", help="path of simple_switch_grpc")
    p_up.add_argument("--lanes", type=int, default=DEFAULT_LANES,
                      help=f"values per aggregation packet: which P4 build the switches run "
                           f"({', '.join(map(str, BUILT_LANES))}; default {DEFAULT_LANES})")
    add_shaping_arguments(p_up)
    commands.add_parser("status", help="switches, links, faults and counters")
    p_exec = commands.add_parser("exec", help="run a command on a server: exec h0 -- CMD")
    p_exec.add_argument("server")
    p_exec.add_argument("cmd", nargs=argparse.REMAINDER)
    commands.add_parser("down", help="remove everything this emulation made")
    p_shape = commands.add_parser("shape", help="re-shape every link of the running emulation "
                                  "(replaces the shaping it had; no option: unimpaired)")
    add_shaping_arguments(p_shape)
    for verb, text in (("fail", "inject a fault into the running emulation"),
                       ("restore", "undo a fault")):
        p_verb = commands.add_parser(verb, help=f"{text}: switch NAME | link hX ethL | "
                                     "controller")
        what = p_verb.add_subparsers(dest="what", required=True)
        p_switch = what.add_parser("switch", help="kill the switch's process (SIGKILL)"
                                   if verb == "fail" else "start the switch again, no pipeline "
                                   "(the health monitor re-provisions it)")
        p_switch.add_argument("switch", help="e.g. s0, s0_1")
        if verb == "restore":
            p_switch.add_argument("--bmv2", help="path of simple_switch_grpc")
        p_link = what.add_parser("link", help="take a server's NIC down (ip link)"
                                 if verb == "fail" else "bring the NIC up again")
        p_link.add_argument("server", help="e.g. h1")
        p_link.add_argument("interface", help="the server's NIC, e.g. eth0")
        if verb == "fail":
            p_link.add_argument("--end", choices=net.LINK_ENDS, default="server",
                                help="server: the NIC in the server's namespace (default); "
                                     "switch: the switch's veth end (the NIC loses carrier); "
                                     "both")
        what.add_parser("controller", help="kill the control plane's health monitor"
                        if verb == "fail" else "start the health monitor again")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        if args.command == "up":
            t0 = time.monotonic()
            state = net.up(args.name, args.topo, args.target,
                           Shaping(args.rate, args.delay, args.loss, args.reorder), args.bmv2,
                           lanes=args.lanes)
            topo = state.topo()
            print(f"bml-net: {state.topology} up on {state.target} in "
                  f"{time.monotonic() - t0:.1f} s: {topo.num_servers} servers "
                  f"({state.namespace_of(0)}..), {topo.num_switches} switches, "
                  f"{len(state.links)} links; run dir {state.run_dir}")
        elif args.command == "status":
            print("\n".join(net.status_lines(State.load(args.name))))
        elif args.command == "exec":
            command = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
            return exec_in(State.load(args.name), args.server, command)
        elif args.command == "down":
            removed = net.down(args.name)
            print(f"bml-net: {args.name} down ({len(removed)} items removed)")
        elif args.command == "shape":
            state = State.load(args.name)
            shaping = Shaping(args.rate, args.delay, args.loss, args.reorder)
            net.reshape(state, shaping)
            print(f"bml-net: {len(state.links)} links of {state.name} re-shaped: "
                  f"{describe_shaping(shaping)}")
        elif args.command in ("fail", "restore"):
            print(inject(State.load(args.name), args))
    except (NetError, TopologyError, ValueError) as exc:
        print(f"bml-net: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
