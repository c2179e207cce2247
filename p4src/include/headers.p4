// Headers and metadata shared by every control block.
#ifndef BML_HEADERS_P4
#define BML_HEADERS_P4

#include "defines.p4"
#include "lanes.p4"

typedef bit<9> port_t;

@controller_header("packet_out")
header packet_out_t {
    bit<16> magic;  // must be CONTROLLER_MAGIC
}

header ethernet_t {
    bit<48> dstAddr;
    bit<48> srcAddr;
    bit<16> etherType;
}

header ipv4_t {
    bit<4>  version;
    bit<4>  ihl;
    bit<8>  diffserv;
    bit<16> totalLen;
    bit<16> identification;
    bit<3>  flags;
    bit<13> fragOffset;
    bit<8>  ttl;
    bit<8>  protocol;
    bit<16> hdrChecksum;
    bit<32> srcAddr;
    bit<32> dstAddr;
}

header udp_t {
    bit<16> srcPort;
    bit<16> dstPort;
    bit<16> length;
    bit<16> checksum;
}

// The aggregation header: see docs/PROTOCOL.md.
header bml_t {
    bit<8>  type;
    bit<8>  version;    // which of the slot's two copies
    bit<16> job_id;
    bit<8>  worker_id;  // bit in the slot's worker bitmap
    bit<8>  owner_id;   // result destination in MODE_TO_OWNER
    bit<16> slot;       // index into the job's pool
    bit<8>  exponent;   // biased max exponent (0 = none)
    bit<8>  count;      // a contribution's blocks (LANE_BLOCKS); PENDING, MISSING:
                        // the copy's contributions so far
    bit<16> generation; // the call's generation: see docs/PROTOCOL.md
    bit<32> offset;     // chunk offset in elements
}

// One block: 32 int32 lanes. A full packet carries LANE_BLOCKS of them, b00 first.
header values_t {
    bit<32> v00; bit<32> v01; bit<32> v02; bit<32> v03;
    bit<32> v04; bit<32> v05; bit<32> v06; bit<32> v07;
    bit<32> v08; bit<32> v09; bit<32> v10; bit<32> v11;
    bit<32> v12; bit<32> v13; bit<32> v14; bit<32> v15;
    bit<32> v16; bit<32> v17; bit<32> v18; bit<32> v19;
    bit<32> v20; bit<32> v21; bit<32> v22; bit<32> v23;
    bit<32> v24; bit<32> v25; bit<32> v26; bit<32> v27;
    bit<32> v28; bit<32> v29; bit<32> v30; bit<32> v31;
}

struct headers_t {
    packet_out_t packet_out;
    ethernet_t   ethernet;
    ipv4_t       ipv4;
    udp_t        udp;
    bml_t        bml;
    FOR_BLOCKS(BLOCK_FIELD)
}

struct metadata_t {
    bit<32> pool_base;    // first slot of the job's pool
    bit<16> pool_size;
    bit<8>  num_workers;  // contributions that complete a slot
    bit<8>  result_mode;
    bit<16> mcast_grp;
    port_t  worker_port;  // where the admitted worker is attached
    port_t  owner_port;   // MODE_TO_OWNER: where the chunk's owner is attached
    bit<1>  generated;    // the switch made this packet: egress addresses it
    port_t  origin_port;  // ingress port, for pruning a broadcast's own copy
    bit<16> reply_port;   // UDP port of the job's workers
    bit<8>  stat;         // STAT_* to count, or STAT_NONE
    bit<1>  completed;    // this packet completed a slot
    bit<8>  drop_reason;  // DROP_* or DROP_NONE
    bit<1>  consumed;     // absorbed into a slot: nothing to send
}

#endif
