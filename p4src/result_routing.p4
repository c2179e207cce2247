// Where a switch-made packet goes: a completed sum to the job's multicast group (in
// MODE_TO_OWNER egress turns the non-owners' copies into header-only ACKs), the answer to a
// retransmission, a generation, a PENDING or a MISSING answer back to that worker only, a
// broadcast to the group.
#ifndef BML_RESULT_ROUTING_P4
#define BML_RESULT_ROUTING_P4

#include "include/headers.p4"

control ResultRouting(inout headers_t hdr, inout metadata_t meta,
                      inout standard_metadata_t standard_metadata) {
    action route_to_owner(port_t port) {
        meta.owner_port = port;
    }
    table owner_route {
        key = { hdr.bml.job_id: exact; hdr.bml.owner_id: exact; }
        actions = { route_to_owner; @defaultonly NoAction; }
        default_action = NoAction();
        size = 4096;
    }
    apply {
        meta.generated = 1;
        meta.origin_port = standard_metadata.ingress_port;
        meta.reply_port = hdr.udp.srcPort;
        if (hdr.bml.type == TYPE_GENERATION || hdr.bml.type == TYPE_PENDING ||
                hdr.bml.type == TYPE_MISSING) {
            standard_metadata.egress_spec = standard_metadata.ingress_port;
        } else if (hdr.bml.type != TYPE_BROADCAST && meta.result_mode == MODE_TO_OWNER &&
                !owner_route.apply().hit) {
            meta.drop_reason = DROP_NO_OWNER;
        } else if (hdr.bml.type == TYPE_RESULT_RETX) {
            standard_metadata.egress_spec = standard_metadata.ingress_port;
        } else {
            standard_metadata.mcast_grp = meta.mcast_grp;
        }
    }
}

#endif
