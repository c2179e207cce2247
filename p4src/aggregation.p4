// The slot pool: per slot copy the running sums, worker bitmap, contribution count, max
// exponent and chunk offset. A copy is re-initialised by the first contribution of its next
// use (its bitmap is empty then, because every worker cleared its bit when it moved on to the
// other copy) and by a RESET frame, since simple_switch_grpc cannot write registers over
// P4Runtime.
#ifndef BML_AGGREGATION_P4
#define BML_AGGREGATION_P4

#include "include/headers.p4"
#include "include/lanes.p4"

control Aggregation(inout headers_t hdr, inout metadata_t meta,
                    inout standard_metadata_t standard_metadata) {
    register<bit<32>>(POOL_COPIES) worker_bitmap;
    register<bit<8>>(POOL_COPIES) contributions;
    register<bit<8>>(POOL_COPIES) max_exponent;
    register<bit<32>>(POOL_COPIES) chunk_offset;
    FOR_LANES(LANE_REGISTER)

    apply {
        bit<32> copy0 = (meta.pool_base + (bit<32>)hdr.bml.slot) << 1;
        bit<32> idx = copy0 | (bit<32>)hdr.bml.version;
        bit<32> other = copy0 | (bit<32>)(1 - hdr.bml.version);
        bit<32> lane;

        if (hdr.bml.type == TYPE_RESET) {
            worker_bitmap.write(copy0, 0);
            worker_bitmap.write(copy0 | 1, 0);
            contributions.write(copy0, 0);
            contributions.write(copy0 | 1, 0);
            meta.stat = STAT_RESET;
            meta.consumed = 1;
        } else {
            bit<32> bitmap;
            bit<8> count;
            bit<32> stored_offset;
            bit<32> me = (bit<32>)1 << (bit<8>)hdr.bml.worker_id;
            worker_bitmap.read(bitmap, idx);
            contributions.read(count, idx);
            chunk_offset.read(stored_offset, idx);

            if ((bitmap & me) != 0) {
                if (count == meta.num_workers && stored_offset == hdr.bml.offset) {
                    // A retransmission into a completed copy: send the stored sum back.
                    FOR_LANES(LANE_LOAD)
                    max_exponent.read(hdr.bml.exponent, idx);
                    hdr.bml.type = TYPE_RESULT_RETX;
                    meta.stat = STAT_RETX_ANSWERED;
                } else {
                    meta.stat = STAT_DUPLICATE;
                    meta.consumed = 1;
                }
            } else if (bitmap != 0 && stored_offset != hdr.bml.offset) {
                meta.drop_reason = DROP_STALE;
            } else if (bitmap != 0 && count == meta.num_workers) {
                // A late copy of a contribution to this completed round, from a worker that
                // has moved on (its bit went when it used the other copy): never added twice.
                meta.stat = STAT_DUPLICATE;
                meta.consumed = 1;
            } else {
                bit<32> keep = 0xffffffff;
                bit<8> exponent;
                bit<32> other_bitmap;
                max_exponent.read(exponent, idx);
                if (bitmap == 0) {
                    keep = 0;
                    count = 0;
                    exponent = 0;
                    chunk_offset.write(idx, hdr.bml.offset);
                }
                worker_bitmap.write(idx, bitmap | me);
                worker_bitmap.read(other_bitmap, other);
                worker_bitmap.write(other, other_bitmap & ~me);
                count = count + 1;
                contributions.write(idx, count);
                if (hdr.bml.exponent > exponent) {
                    exponent = hdr.bml.exponent;
                }
                max_exponent.write(idx, exponent);
                FOR_LANES(LANE_ADD)
                meta.stat = STAT_AGGREGATED;
                if (count == meta.num_workers) {
                    meta.completed = 1;
                    hdr.bml.type = TYPE_RESULT;
                    hdr.bml.exponent = exponent;
                } else {
                    meta.consumed = 1;
                }
            }
        }
    }
}

#endif
