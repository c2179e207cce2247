// The slot pool: per slot copy the running sums, worker bitmap, contribution count, max
// exponent, chunk offset and generation. A copy is re-initialised by the first contribution of
// its next use (its bitmap is empty then, because every worker cleared its bit when it moved on
// to the other copy), by the first contribution of a newer call (another generation: whatever
// an aborted call left there is abandoned) and by a RESET frame, since simple_switch_grpc
// cannot write registers over P4Runtime. Per job the switch keeps the newest generation it has
// seen: a contribution of an older call is not added but answered with it.
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
    register<bit<16>>(POOL_COPIES) copy_generation;
    register<bit<16>>(JOB_IDS) job_generation;
    FOR_BLOCKS(BLOCK_REGISTERS)

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
            job_generation.write((bit<32>)hdr.bml.job_id, 0);  // a job set up afresh
            meta.stat = STAT_RESET;
            meta.consumed = 1;
        } else {
            bit<16> current;
            job_generation.read(current, (bit<32>)hdr.bml.job_id);
            bit<16> ahead = hdr.bml.generation - current;
            if (hdr.bml.type == TYPE_DATA && ahead != 0 && ahead < GENERATION_HALF) {
                current = hdr.bml.generation;  // a newer call: from now on the job's
                job_generation.write((bit<32>)hdr.bml.job_id, current);
            }
            if (hdr.bml.type == TYPE_GENERATION || hdr.bml.generation != current) {
                // A query, or a contribution of an older call (a worker that missed the
                // restart of its job): not added; the sender learns the job's generation.
                if (hdr.bml.type == TYPE_GENERATION) {
                    meta.stat = STAT_GENERATION;
                } else {
                    meta.stat = STAT_OLD_CALL;
                }
                // Header only, with this build's blocks: a host of another width learns it
                // from its first answer.
                hdr.bml.type = TYPE_GENERATION;
                hdr.bml.generation = current;
                hdr.bml.count = LANE_BLOCKS;
                FOR_BLOCKS(INVALIDATE_BLOCK)
            } else {
                bit<32> bitmap;
                bit<8> count;
                bit<32> stored_offset;
                bit<16> stored_generation;
                bit<32> me = (bit<32>)1 << (bit<8>)hdr.bml.worker_id;
                worker_bitmap.read(bitmap, idx);
                contributions.read(count, idx);
                chunk_offset.read(stored_offset, idx);
                copy_generation.read(stored_generation, idx);
                if (stored_generation != hdr.bml.generation) {
                    bitmap = 0;  // left by an older call: abandoned
                    count = 0;
                }

                if ((bitmap & me) != 0) {
#if !PROBE_ANSWERS_SUM
                    if (hdr.bml.type == TYPE_PROBE && count == meta.num_workers
                            && stored_offset == hdr.bml.offset) {
                        // A PROBE into its completed copy, in a build whose sum would grow the
                        // 58-byte question by more than ANSWER_GROWTH_BYTES: MISSING (header
                        // only, with the count), and the prober re-sends its full frame, which
                        // is answered with the sum below.
                        hdr.bml.type = TYPE_MISSING;
                        hdr.bml.count = count;
                        meta.stat = STAT_MISSING;
                    } else
#endif
                    if (count == meta.num_workers && stored_offset == hdr.bml.offset) {
                        // A retransmission (or a PROBE, which carries no lanes) into a
                        // completed copy: send the stored sum back.
                        FOR_BLOCKS(VALIDATE_BLOCK)
                        FOR_BLOCKS(BLOCK_LOAD)
                        max_exponent.read(hdr.bml.exponent, idx);
                        hdr.bml.type = TYPE_RESULT_RETX;
                        meta.stat = STAT_RETX_ANSWERED;
                    } else if (stored_offset == hdr.bml.offset) {
                        // A re-sent contribution into the copy it is already in, still
                        // filling: not added again, but its sender learns that it is in
                        // (header only, with the count so far), so it stops re-sending and
                        // waits for the others.
                        hdr.bml.type = TYPE_PENDING;
                        hdr.bml.count = count;
                        FOR_BLOCKS(INVALIDATE_BLOCK)
                        meta.stat = STAT_PENDING;
                    } else {
                        meta.stat = STAT_DUPLICATE;
                        meta.consumed = 1;
                    }
                } else if (hdr.bml.type == TYPE_PROBE) {
                    // The prober's contribution is not in this copy: it was lost on its way,
                    // and the prober sends it again at once (header only, with the count).
                    hdr.bml.type = TYPE_MISSING;
                    hdr.bml.count = count;
                    meta.stat = STAT_MISSING;
                } else if (bitmap != 0 && stored_offset != hdr.bml.offset) {
                    meta.drop_reason = DROP_STALE;
                } else if (count == meta.num_workers && stored_offset == hdr.bml.offset) {
                    // A late copy of a contribution to this completed round, from a worker that
                    // has moved on (its bit went when it used the other copy), even after every
                    // worker moved on (the bitmap is empty then): never added twice. Within a
                    // call no two uses of a copy carry the same offset.
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
                        copy_generation.write(idx, hdr.bml.generation);
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
                    FOR_BLOCKS(BLOCK_ADD)
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
}

#endif
