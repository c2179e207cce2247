// The lanes: LANE_BLOCKS blocks of 32 int32 lanes (hdr.b00 .. the last block), a build
// parameter (tools/build_p4.sh: -DLANE_BLOCKS=2|8|69, that is 64, 256 or 2208 lanes; 2 when
// not given). Every per-block and per-lane statement is expanded from these lists by the C
// preprocessor.
#ifndef BML_LANES_P4
#define BML_LANES_P4

#include "defines.p4"

// FOR_BLOCKS(M): M(B) for every block B, in wire order. LAST_BLOCK: the block a full packet
// ends with (the parser stops before it in a shorter one).
#if LANE_BLOCKS == 2
#define FOR_BLOCKS(M) \
    M(b00) M(b01)
#define LAST_BLOCK b01
#elif LANE_BLOCKS == 8
#define FOR_BLOCKS(M) \
    M(b00) M(b01) M(b02) M(b03) M(b04) M(b05) M(b06) M(b07)
#define LAST_BLOCK b07
#elif LANE_BLOCKS == 69
#define FOR_BLOCKS(M) \
    M(b00) M(b01) M(b02) M(b03) M(b04) M(b05) M(b06) M(b07) \
    M(b08) M(b09) M(b10) M(b11) M(b12) M(b13) M(b14) M(b15) \
    M(b16) M(b17) M(b18) M(b19) M(b20) M(b21) M(b22) M(b23) \
    M(b24) M(b25) M(b26) M(b27) M(b28) M(b29) M(b30) M(b31) \
    M(b32) M(b33) M(b34) M(b35) M(b36) M(b37) M(b38) M(b39) \
    M(b40) M(b41) M(b42) M(b43) M(b44) M(b45) M(b46) M(b47) \
    M(b48) M(b49) M(b50) M(b51) M(b52) M(b53) M(b54) M(b55) \
    M(b56) M(b57) M(b58) M(b59) M(b60) M(b61) M(b62) M(b63) \
    M(b64) M(b65) M(b66) M(b67) M(b68)
#define LAST_BLOCK b68
#else
#error "LANE_BLOCKS must be 2, 8 or 69 (the widths of bml.protocol.BUILT_LANES)"
#endif

// FOR_BLOCK(M, B): M(B, I) for the 32 lanes I of block B.
#define FOR_BLOCK(M, B) \
    M(B, 00) M(B, 01) M(B, 02) M(B, 03) M(B, 04) M(B, 05) M(B, 06) M(B, 07) \
    M(B, 08) M(B, 09) M(B, 10) M(B, 11) M(B, 12) M(B, 13) M(B, 14) M(B, 15) \
    M(B, 16) M(B, 17) M(B, 18) M(B, 19) M(B, 20) M(B, 21) M(B, 22) M(B, 23) \
    M(B, 24) M(B, 25) M(B, 26) M(B, 27) M(B, 28) M(B, 29) M(B, 30) M(B, 31)

// Per-block statements.
#define BLOCK_FIELD(B) values_t B;
#define EXTRACT_BLOCK(B) pkt.extract(hdr.B);
#define EMIT_BLOCK(B) pkt.emit(hdr.B);
#define VALIDATE_BLOCK(B) hdr.B.setValid();
#define INVALIDATE_BLOCK(B) hdr.B.setInvalid();

// One register array per lane, indexed by slot copy: sum_<block>_<lane>, e.g. sum_b00_07
// (control_plane/p4info.py counts them: P4Info.lanes).
#define LANE_REGISTER(B, I) register<bit<32>>(POOL_COPIES) sum_##B##_##I;
// sum = (stored & keep) + value: keep is 0 for the first contribution, which re-initialises.
#define LANE_ADD(B, I) \
    sum_##B##_##I.read(lane, idx); \
    lane = (lane & keep) + hdr.B.v##I; \
    sum_##B##_##I.write(idx, lane); \
    hdr.B.v##I = lane;
// Load the stored sum into the packet (answering a retransmission).
#define LANE_LOAD(B, I) sum_##B##_##I.read(hdr.B.v##I, idx);

#define BLOCK_REGISTERS(B) FOR_BLOCK(LANE_REGISTER, B)
#define BLOCK_ADD(B) FOR_BLOCK(LANE_ADD, B)
#define BLOCK_LOAD(B) FOR_BLOCK(LANE_LOAD, B)

#endif
