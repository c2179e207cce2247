// Ordinary traffic: exact match on the destination MAC, installed by the control plane.
#ifndef BML_FORWARDING_P4
#define BML_FORWARDING_P4

#include "include/headers.p4"

control Forwarding(inout headers_t hdr, inout metadata_t meta,
                   inout standard_metadata_t standard_metadata) {
    action forward_to(port_t port) {
        standard_metadata.egress_spec = port;
        meta.stat = STAT_FORWARDED;
    }
    action no_route() {
        meta.drop_reason = DROP_NO_ROUTE;
    }
    table l2_forward {
        key = { hdr.ethernet.dstAddr: exact; }
        actions = { forward_to; @defaultonly no_route; }
        default_action = no_route();
        size = 1024;
    }
    apply {
        l2_forward.apply();
    }
}

#endif
