// Parser and deparser. Frames from the CPU port (P4Runtime PacketOut) carry packet_out first.
#ifndef BML_PARSER_P4
#define BML_PARSER_P4

#include "include/headers.p4"

parser BmlParser(packet_in pkt, out headers_t hdr, inout metadata_t meta,
                 inout standard_metadata_t standard_metadata) {
    state start {
        transition select(standard_metadata.ingress_port) {
            CPU_PORT: parse_packet_out;
            default: parse_ethernet;
        }
    }
    state parse_packet_out {
        pkt.extract(hdr.packet_out);
        transition parse_ethernet;
    }
    state parse_ethernet {
        pkt.extract(hdr.ethernet);
        transition select(hdr.ethernet.etherType) {
            0x0800: parse_ipv4;
            default: accept;
        }
    }
    state parse_ipv4 {
        pkt.extract(hdr.ipv4);
        // Only IPv4 version 4 without options, not a fragment (MF clear, offset 0), UDP, is
        // looked into; anything else is ordinary traffic (docs/PROTOCOL.md, malformed frames).
        // Frames with another EtherType (802.1Q tags included) never get here.
        transition select(hdr.ipv4.version, hdr.ipv4.ihl, hdr.ipv4.flags, hdr.ipv4.fragOffset,
                          hdr.ipv4.protocol) {
            (4, 5, 3w0 &&& 3w1, 0, 17): parse_udp;
            default: accept;
        }
    }
    state parse_udp {
        pkt.extract(hdr.udp);
        transition select(hdr.udp.dstPort) {
            BML_UDP_PORT: parse_bml;
            default: accept;
        }
    }
    // A shorter aggregation packet stops here with a block invalid (a header-only PROBE or
    // GENERATION with b00 invalid); admission tells which of them may be short.
    state parse_bml {
        pkt.extract(hdr.bml);
        FOR_BLOCKS(EXTRACT_BLOCK)
        transition accept;
    }
}

control BmlDeparser(packet_out pkt, in headers_t hdr) {
    apply {
        pkt.emit(hdr.ethernet);
        pkt.emit(hdr.ipv4);
        pkt.emit(hdr.udp);
        pkt.emit(hdr.bml);
        FOR_BLOCKS(EMIT_BLOCK)
    }
}

control BmlVerifyChecksum(inout headers_t hdr, inout metadata_t meta) {
    apply { }
}

control BmlComputeChecksum(inout headers_t hdr, inout metadata_t meta) {
    // Only the packets the switch makes get a new checksum: a forwarded frame leaves as it
    // came, byte for byte (its header may carry options the 20-byte sum would not cover).
    apply {
        update_checksum(hdr.ipv4.isValid() && meta.generated == 1,
            { hdr.ipv4.version, hdr.ipv4.ihl, hdr.ipv4.diffserv, hdr.ipv4.totalLen,
              hdr.ipv4.identification, hdr.ipv4.flags, hdr.ipv4.fragOffset, hdr.ipv4.ttl,
              hdr.ipv4.protocol, hdr.ipv4.srcAddr, hdr.ipv4.dstAddr },
            hdr.ipv4.hdrChecksum, HashAlgorithm.csum16);
    }
}

#endif
