// Admission: an aggregation packet is accepted only for an installed job, from an installed
// worker on the port that worker is attached to, with sane fields. Everything else gets a
// drop reason. Control (RESET) frames are accepted only from the CPU port with the magic.
#ifndef BML_ADMISSION_P4
#define BML_ADMISSION_P4

#include "include/headers.p4"

control Admission(inout headers_t hdr, inout metadata_t meta,
                  inout standard_metadata_t standard_metadata) {
    action set_job(bit<32> pool_base, bit<16> pool_size, bit<8> num_workers,
                   bit<8> result_mode, bit<16> mcast_grp) {
        meta.pool_base = pool_base;
        meta.pool_size = pool_size;
        meta.num_workers = num_workers;
        meta.result_mode = result_mode;
        meta.mcast_grp = mcast_grp;
    }
    table job_config {
        key = { hdr.bml.job_id: exact; }
        actions = { set_job; @defaultonly NoAction; }
        default_action = NoAction();
        size = 256;
    }
    action admit(port_t port) {
        meta.worker_port = port;
    }
    table worker_admission {
        key = { hdr.bml.job_id: exact; hdr.bml.worker_id: exact; }
        actions = { admit; @defaultonly NoAction; }
        default_action = NoAction();
        size = 4096;
    }
    apply {
        // A contribution carries exactly this build's blocks, and says so in count: a host
        // of another width is told apart first, whatever length its frames have. PROBE
        // copies a DATA header; a GENERATION question carries any count (its answer says
        // this build's).
        bool contribution = hdr.bml.isValid() && (hdr.bml.type == TYPE_DATA ||
            hdr.bml.type == TYPE_BROADCAST || hdr.bml.type == TYPE_RESET ||
            hdr.bml.type == TYPE_PROBE);
        // An aggregation packet is exactly one full frame, and a PROBE or a GENERATION
        // question exactly the header: IPv4 and UDP lengths and the frame's own length must
        // all say so (no trailing bytes).
        bool header_only = hdr.bml.isValid() && (hdr.bml.type == TYPE_PROBE ||
            hdr.bml.type == TYPE_GENERATION);
        bit<16> ipv4_len = IPV4_LEN_FULL;
        bit<16> udp_len = UDP_LEN_FULL;
        bit<32> frame_bytes = FRAME_BYTES;
        if (header_only) {
            ipv4_len = IPV4_LEN_HEADER_ONLY;
            udp_len = UDP_LEN_HEADER_ONLY;
            frame_bytes = HEADER_ONLY_FRAME_BYTES;
        }
        if (hdr.packet_out.isValid()) {
            frame_bytes = frame_bytes + PACKET_OUT_BYTES;
        }
        if (contribution && hdr.bml.count != LANE_BLOCKS) {
            meta.drop_reason = DROP_BAD_WIDTH;
        } else if (!hdr.bml.isValid() || (!header_only && !hdr.LAST_BLOCK.isValid())) {
            meta.drop_reason = DROP_SHORT_PACKET;
        } else if (hdr.ipv4.totalLen != ipv4_len || hdr.udp.length != udp_len ||
                   standard_metadata.packet_length != frame_bytes) {
            meta.drop_reason = DROP_BAD_LENGTH;
        } else if (hdr.bml.version > 1 || (hdr.bml.type != TYPE_DATA &&
                   hdr.bml.type != TYPE_BROADCAST && hdr.bml.type != TYPE_RESET &&
                   hdr.bml.type != TYPE_GENERATION && hdr.bml.type != TYPE_PROBE)) {
            meta.drop_reason = DROP_BAD_TYPE;
        } else if (!job_config.apply().hit) {
            meta.drop_reason = DROP_UNKNOWN_JOB;
        } else if ((bit<32>)hdr.bml.slot >= (bit<32>)meta.pool_size) {
            meta.drop_reason = DROP_BAD_SLOT;
        } else if (hdr.bml.type == TYPE_RESET) {
            if (standard_metadata.ingress_port != CPU_PORT || !hdr.packet_out.isValid() ||
                    hdr.packet_out.magic != CONTROLLER_MAGIC) {
                meta.drop_reason = DROP_FORGED_CONTROL;
            }
        } else if (!worker_admission.apply().hit) {
            meta.drop_reason = DROP_FORGED_WORKER;
        } else if (meta.worker_port != standard_metadata.ingress_port) {
            meta.drop_reason = DROP_WRONG_PORT;
        }
    }
}

#endif
