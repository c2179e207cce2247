// Constants shared by every control block. bml/protocol.py must agree (tests/test_protocol.py).
#ifndef BML_DEFINES_P4
#define BML_DEFINES_P4

#define BML_UDP_PORT 47000
#define CPU_PORT 510
#define CONTROLLER_MAGIC 0xB3C0

// The build's width: blocks of LANES_PER_BLOCK int32 lanes per aggregation packet, given to
// p4c as -DLANE_BLOCKS (tools/build_p4.sh); a contribution's count must say as many.
#ifndef LANE_BLOCKS
#define LANE_BLOCKS 2
#endif
#define LANES_PER_BLOCK 32
#define LANES (LANES_PER_BLOCK * LANE_BLOCKS)
#define BLOCK_BYTES 128           // 4 bytes per lane
#define POOL_SLOTS 4096
#define POOL_COPIES 8192          // two copies (version 0 and 1) of every slot
#define JOB_IDS 4096              // job ids 0..4095: one generation register each
#define GENERATION_HALF 0x8000    // a generation up to this far ahead (mod 2^16) is newer
#define MAX_WORKERS 32

// Lengths the switch writes into the packets it generates.
#define IPV4_LEN_HEADER_ONLY 44   // 20 IPv4 + 8 UDP + 16 BML
#define UDP_LEN_HEADER_ONLY 24
#define HEADER_ONLY_FRAME_BYTES 58  // 14 Ethernet + IPV4_LEN_HEADER_ONLY: PROBE, GENERATION
#define IPV4_LEN_FULL (IPV4_LEN_HEADER_ONLY + BLOCK_BYTES * LANE_BLOCKS)  // and the lanes
#define UDP_LEN_FULL (UDP_LEN_HEADER_ONLY + BLOCK_BYTES * LANE_BLOCKS)
#define FRAME_BYTES (HEADER_ONLY_FRAME_BYTES + BLOCK_BYTES * LANE_BLOCKS)  // a full packet
#define PACKET_OUT_BYTES 2        // packet_out header in front of a CPU-port frame

// No answer is larger than its question by more than this: BMv2's simple_switch gives a packet
// that much room to grow (PacketBuffer(len + 512)). A PROBE (header only) is answered with the
// stored sum only where the lanes fit in it (LANE_BLOCKS <= 4); in wider builds MISSING instead,
// and the full frame the prober then re-sends is answered with the sum.
#define ANSWER_GROWTH_BYTES 512
#define PROBE_ANSWERS_SUM (BLOCK_BYTES * LANE_BLOCKS <= ANSWER_GROWTH_BYTES)

// bml.type
#define TYPE_DATA 1
#define TYPE_RESULT 2
#define TYPE_RESULT_RETX 3
#define TYPE_BROADCAST 4
#define TYPE_RESET 5
#define TYPE_ACK 6
#define TYPE_GENERATION 7         // host: which generation is the job at? switch: this one
#define TYPE_PENDING 8            // switch: your contribution is in, the copy is still filling
#define TYPE_PROBE 9              // host (header only): is my contribution in this copy?
#define TYPE_MISSING 10           // switch (header only): it is not: send it again

// job_config result_mode
#define MODE_MULTICAST 0
#define MODE_TO_OWNER 1

// stats counter indices
#define STAT_AGGREGATED 0
#define STAT_COMPLETED 1
#define STAT_DUPLICATE 2
#define STAT_RETX_ANSWERED 3
#define STAT_BROADCAST 4
#define STAT_RESET 5
#define STAT_FORWARDED 6
#define STAT_GENERATION 7         // a generation query answered
#define STAT_OLD_CALL 8           // a contribution of an older call: not added, answered
#define STAT_PENDING 9            // a re-sent contribution into a filling copy: PENDING
#define STAT_MISSING 10           // a PROBE answered MISSING (see PROBE_ANSWERS_SUM)
#define STAT_NONE 255
#define STATS_SIZE 16

// drops counter indices
#define DROP_SHORT_PACKET 0
#define DROP_BAD_WIDTH 1          // count is not LANE_BLOCKS
#define DROP_UNKNOWN_JOB 2
#define DROP_FORGED_WORKER 3
#define DROP_WRONG_PORT 4
#define DROP_BAD_SLOT 5
#define DROP_BAD_TYPE 6
#define DROP_NO_OWNER 7
#define DROP_FORGED_CONTROL 8
#define DROP_NO_ROUTE 9
#define DROP_STALE 10
#define DROP_BAD_LENGTH 11
#define DROP_NONE 255
#define DROPS_SIZE 16

#endif
