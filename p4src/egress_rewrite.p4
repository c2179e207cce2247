// Egress: address every switch-made copy to the host on its port, from the switch's own
// address, and shrink the non-owners' copies of a MODE_TO_OWNER result to ACKs.
#ifndef BML_EGRESS_REWRITE_P4
#define BML_EGRESS_REWRITE_P4

#include "include/headers.p4"

control EgressRewrite(inout headers_t hdr, inout metadata_t meta,
                      inout standard_metadata_t standard_metadata) {
    counter(1, CounterType.packets) unaddressed;

    action set_host_address(bit<48> host_mac, bit<32> host_ip,
                            bit<48> switch_mac, bit<32> switch_ip) {
        hdr.ethernet.dstAddr = host_mac;
        hdr.ethernet.srcAddr = switch_mac;
        hdr.ipv4.dstAddr = host_ip;
        hdr.ipv4.srcAddr = switch_ip;
    }
    table host_address {
        key = { standard_metadata.egress_port: exact; }
        actions = { set_host_address; @defaultonly NoAction; }
        default_action = NoAction();
        size = 512;
    }
    apply {
        if (meta.generated == 1) {
            if (hdr.bml.type == TYPE_BROADCAST &&
                    standard_metadata.egress_port == meta.origin_port) {
                mark_to_drop(standard_metadata);
            } else if (!host_address.apply().hit) {
                unaddressed.count(0);
                mark_to_drop(standard_metadata);
            } else {
                if (meta.result_mode == MODE_TO_OWNER && (hdr.bml.type == TYPE_RESULT ||
                        hdr.bml.type == TYPE_RESULT_RETX) &&
                        standard_metadata.egress_port != meta.owner_port) {
                    FOR_BLOCKS(INVALIDATE_BLOCK)
                    hdr.bml.type = TYPE_ACK;
                }
                if (hdr.b00.isValid()) {
                    hdr.ipv4.totalLen = IPV4_LEN_FULL;
                    hdr.udp.length = UDP_LEN_FULL;
                } else {
                    hdr.ipv4.totalLen = IPV4_LEN_HEADER_ONLY;
                    hdr.udp.length = UDP_LEN_HEADER_ONLY;
                }
                hdr.ipv4.ttl = 64;
                hdr.udp.srcPort = BML_UDP_PORT;
                hdr.udp.dstPort = meta.reply_port;
                hdr.udp.checksum = 0;
            }
        }
    }
}

#endif
