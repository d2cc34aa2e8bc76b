/*
 * The device executor's layout and cutting, checked on the CPU: the exchange region's tables,
 * bulk slots, low-latency slots and unpack areas never overlap and fill exactly the size the
 * host allocates; and the way the kernel (and the host) cut a byte stream into pieces per round
 * and block covers every byte exactly once, 16-byte aligned, never more than a slot, for every
 * length, lane count and slot size a job can choose. Sender and receiver compute the same cut
 * from the length alone, so this is what keeps them in step.
 */
#include <check.h>
#include <stdlib.h>

#include "harness.h"
#include "kernels.h"

typedef unsigned long long u64;

START_TEST(test_region_layout)
{
    const int ns[] = {1, 2, 3, 8}, nbs[] = {1, 7, 32, 128}, nslots[] = {2, 4, 16};
    const u64 slots[] = {4096, 65536, 1ull << 24}, caps[] = {0, 1, 131072};
    ck_assert(DEV_OFF_DSTEP + DEV_TABLE_BYTES <= DEV_OFF_SLOTS);
    /* the low-latency allreduce's steps: the direct steps' table, second row */
    ck_assert_uint_eq(DEV_OFF_LSTEP, DEV_OFF_DSTEP + 8 * DEV_MAX_BLOCKS);
    ck_assert(DEV_OFF_LSTEP + 8 * DEV_MAX_BLOCKS <= DEV_OFF_DSTEP + DEV_TABLE_BYTES);
    ck_assert(DEV_OFF_RSTEP + DEV_TABLE_BYTES <= 4 * DEV_TABLE_BYTES); /* claim word after it */
    for (size_t a = 0; a < sizeof(ns) / sizeof(ns[0]); a++)
        for (size_t b = 0; b < sizeof(nbs) / sizeof(nbs[0]); b++)
            for (size_t c = 0; c < sizeof(nslots) / sizeof(nslots[0]); c++)
                for (size_t d = 0; d < sizeof(slots) / sizeof(slots[0]); d++) {
                    int n = ns[a], nb = nbs[b], ns_ = nslots[c];
                    u64 slot = slots[d];
                    u64 bulk_end = DEV_SLOT_OFF(n - 1, nb - 1, ns_ - 1, nb, ns_, slot) + slot;
                    ck_assert_uint_eq(DEV_SLOT_OFF(0, 0, 0, nb, ns_, slot), DEV_OFF_SLOTS);
                    ck_assert_uint_eq(bulk_end, DEV_LL_BASE(n, nb, ns_, slot));
                    u64 ll_end =
                        DEV_LL_SLOT_OFF(n - 1, nb - 1, ns_ - 1, n, nb, ns_, slot) + DEV_LL_SLOT;
                    ck_assert_uint_eq(ll_end, DEV_UNPACK_OFF(0, 0, n, nb, ns_, slot));
                    ck_assert_uint_eq(DEV_UNPACK_OFF(n - 1, nb - 1, n, nb, ns_, slot) +
                                          DEV_LL_PIECE,
                                      DEV_LLA_BASE(n, nb, ns_, slot));
                    for (size_t e = 0; e < sizeof(caps) / sizeof(caps[0]); e++) {
                        u64 cap = caps[e], base = DEV_LLA_BASE(n, nb, ns_, slot);
                        u64 end = cap ? base + DEV_LLA_OFF(n - 1, 1, cap - 1, cap) + 16 : base;
                        ck_assert_uint_eq(end, DEV_REGION_BYTES(n, nb, ns_, slot, cap));
                        if (cap) /* a writer's two parities follow each other, then the next */
                            ck_assert_uint_eq(DEV_LLA_OFF(1, 0, 0, cap),
                                              DEV_LLA_OFF(0, 1, cap - 1, cap) + 16);
                    }
                    /* neighbouring slots of one lane and of the next writer do not touch */
                    if (ns_ > 1)
                        ck_assert_uint_eq(DEV_SLOT_OFF(0, 0, 1, nb, ns_, slot) -
                                              DEV_SLOT_OFF(0, 0, 0, nb, ns_, slot),
                                          slot);
                }
}
END_TEST

/* Every byte of [0, len) in exactly one piece, in order of position. */
static void check_cut(u64 len, int nb, u64 slot)
{
    u64 rounds = dev_rounds_of(len, nb, slot), next = 0, pieces = 0;
    /* pieces come out round by round, block by block: positions ascend in that order */
    for (u64 k = 0; k < rounds; k++)
        for (int b = 0; b < nb; b++) {
            u64 pos = 0, plen = 0;
            if (!dev_piece_of(len, k, nb, b, slot, &pos, &plen)) continue;
            ck_assert_msg(pos == next,
                          "len %llu nb %d slot %llu: piece (%llu,%d) at %llu, "
                          "expected %llu",
                          len, nb, slot, k, b, pos, next);
            ck_assert_msg(pos % 16 == 0, "piece at %llu not 16-byte aligned", pos);
            ck_assert_msg(plen > 0 && plen <= slot, "piece of %llu bytes, slot %llu", plen, slot);
            next = pos + plen;
            pieces++;
        }
    ck_assert_msg(next == len, "len %llu nb %d slot %llu: pieces end at %llu", len, nb, slot, next);
    /* no piece beyond the last round */
    u64 pos, plen;
    for (int b = 0; b < nb; b++)
        ck_assert(!dev_piece_of(len, rounds, nb, b, slot, &pos, &plen));
    if (len == 0) ck_assert_uint_eq(pieces, 0);
    /* low-latency streams: small pieces only */
    if (dev_is_ll(len, nb, slot, 0)) {
        ck_assert(len <= DEV_LL_MAX);
        ck_assert(dev_piece_bytes(len, nb, slot) <= DEV_LL_PIECE);
    }
    ck_assert(!dev_is_ll(len, nb, slot, 1));
}

/* DEV_LLA: the host's launch and the kernel's loops give every chunk to exactly one thread,
 * and always to the block the fixed mapping names (so a lane's slots see only its steps). */
static void check_lla(u64 len, int nb)
{
    unsigned grid, threads;
    dev_lla_launch(len, nb, &grid, &threads);
    u64 nchunk = (len + 7) / 8;
    ck_assert(grid >= 1 && grid <= (unsigned)nb && threads >= 32 && threads <= DEV_LLA_SPAN);
    ck_assert_uint_eq(threads % 32, 0);
    unsigned char *seen = calloc(nchunk + 1, 1);
    ck_assert_ptr_nonnull(seen);
    for (unsigned b = 0; b < grid; b++)
        for (unsigned t = 0; t < threads; t++) /* the kernel's two loops, per thread */
            for (u64 r = (u64)b * DEV_LLA_SPAN; r < nchunk; r += DEV_LLA_SPAN * (u64)nb)
                for (u64 c = r + t; c < r + DEV_LLA_SPAN && c < nchunk; c += threads) {
                    ck_assert_uint_eq((c / DEV_LLA_SPAN) % (u64)nb, b);
                    ck_assert_msg(seen[c] == 0, "len %llu nb %d: chunk %llu twice", len, nb, c);
                    seen[c] = 1;
                }
    for (u64 c = 0; c < nchunk; c++)
        ck_assert_msg(seen[c], "len %llu nb %d: chunk %llu missed", len, nb, c);
    free(seen);
}

START_TEST(test_lla_cover)
{
    const u64 lens[] = {1, 7, 8, 9, 255, 256, 4095, 4096, 4097, 65536, 65544, 1048576, 1048583};
    const int nbs[] = {1, 3, 64, 128};
    for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++)
        for (size_t j = 0; j < sizeof(nbs) / sizeof(nbs[0]); j++)
            check_lla(lens[i], nbs[j]);
}
END_TEST

START_TEST(test_stream_cut)
{
    const u64 lens[] = {0,    1,     15,    16,    17,      4095,      4096,
                        4097, 65535, 65536, 65537, 1048579, 123456789, (1ull << 31) + 4099};
    const int nbs[] = {1, 3, 32, 128};
    const u64 slots[] = {4096, 65536, 262144};
    for (size_t a = 0; a < sizeof(lens) / sizeof(lens[0]); a++)
        for (size_t b = 0; b < sizeof(nbs) / sizeof(nbs[0]); b++)
            for (size_t c = 0; c < sizeof(slots) / sizeof(slots[0]); c++) {
                if (lens[a] > (1ull << 27) && slots[c] < 65536) continue; /* time only */
                check_cut(lens[a], nbs[b], slots[c]);
            }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("devplan");
    TCase *tc = tcase_create("devplan");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_region_layout);
    tcase_add_test(tc, test_stream_cut);
    tcase_add_test(tc, test_lla_cover);
    suite_add_tcase(s, tc);
    return h_check_main(s, false, CK_NORMAL);
}
