// Per-lane statements, expanded for the 64 lanes (two blocks of 32) by the C preprocessor.
#ifndef BML_LANES_P4
#define BML_LANES_P4

#define FOR_BLOCK(M, B) \
    M(B, 00) M(B, 01) M(B, 02) M(B, 03) M(B, 04) M(B, 05) M(B, 06) M(B, 07) \
    M(B, 08) M(B, 09) M(B, 10) M(B, 11) M(B, 12) M(B, 13) M(B, 14) M(B, 15) \
    M(B, 16) M(B, 17) M(B, 18) M(B, 19) M(B, 20) M(B, 21) M(B, 22) M(B, 23) \
    M(B, 24) M(B, 25) M(B, 26) M(B, 27) M(B, 28) M(B, 29) M(B, 30) M(B, 31)
#define FOR_LANES(M) FOR_BLOCK(M, lo) FOR_BLOCK(M, hi)

// One register array per lane, indexed by slot copy.
#define LANE_REGISTER(B, I) register<bit<32>>(POOL_COPIES) sum_##B##_##I;
// sum = (stored & keep) + value: keep is 0 for the first contribution, which re-initialises.
#define LANE_ADD(B, I) \
    sum_##B##_##I.read(lane, idx); \
    lane = (lane & keep) + hdr.B.v##I; \
    sum_##B##_##I.write(idx, lane); \
    hdr.B.v##I = lane;
// Load the stored sum into the packet (answering a retransmission).
#define LANE_LOAD(B, I) sum_##B##_##I.read(hdr.B.v##I, idx);

#endif
