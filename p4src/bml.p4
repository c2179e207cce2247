/* BML-INA data plane: in-network gradient aggregation for v1model / simple_switch_grpc.
 * One file per control block; this file wires them together and counts what happened. */
#include <core.p4>
#include <v1model.p4>

#include "include/headers.p4"
#include "parser.p4"
#include "forwarding.p4"
#include "admission.p4"
#include "aggregation.p4"
#include "result_routing.p4"
#include "egress_rewrite.p4"

control BmlIngress(inout headers_t hdr, inout metadata_t meta,
                   inout standard_metadata_t standard_metadata) {
    counter(STATS_SIZE, CounterType.packets) stats;
    counter(DROPS_SIZE, CounterType.packets) drops;
    Forwarding() forwarding;
    Admission() admission;
    Aggregation() aggregation;
    ResultRouting() result_routing;

    apply {
        meta.stat = STAT_NONE;
        meta.drop_reason = DROP_NONE;
        meta.completed = 0;
        meta.consumed = 0;
        meta.generated = 0;
        if (hdr.packet_out.isValid() && hdr.packet_out.magic != CONTROLLER_MAGIC) {
            meta.drop_reason = DROP_FORGED_CONTROL;
        } else if (!hdr.udp.isValid() || hdr.udp.dstPort != BML_UDP_PORT) {
            forwarding.apply(hdr, meta, standard_metadata);
        } else {
            admission.apply(hdr, meta, standard_metadata);
            if (meta.drop_reason == DROP_NONE && hdr.bml.type != TYPE_BROADCAST) {
                aggregation.apply(hdr, meta, standard_metadata);
            } else if (meta.drop_reason == DROP_NONE) {
                meta.stat = STAT_BROADCAST;
            }
            if (meta.drop_reason == DROP_NONE && meta.consumed == 0) {
                result_routing.apply(hdr, meta, standard_metadata);
            }
        }
        hdr.packet_out.setInvalid();
        if (meta.stat != STAT_NONE) {
            stats.count((bit<32>)meta.stat);
        }
        if (meta.completed == 1) {
            stats.count((bit<32>)STAT_COMPLETED);
        }
        if (meta.drop_reason != DROP_NONE) {
            drops.count((bit<32>)meta.drop_reason);
            mark_to_drop(standard_metadata);
        } else if (meta.consumed == 1) {
            mark_to_drop(standard_metadata);
        }
    }
}

control BmlEgress(inout headers_t hdr, inout metadata_t meta,
                  inout standard_metadata_t standard_metadata) {
    EgressRewrite() egress_rewrite;
    apply {
        egress_rewrite.apply(hdr, meta, standard_metadata);
    }
}

V1Switch(BmlParser(), BmlVerifyChecksum(), BmlIngress(), BmlEgress(), BmlComputeChecksum(),
         BmlDeparser()) main;
