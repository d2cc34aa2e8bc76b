/*
 * Every collective over the grid of ranks x counts x types x ops, in place and out of place,
 * compared bit for bit with a scalar reference. Inputs are small integers (and, for products,
 * mostly ones), so that every order of reduction gives the same exact value.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "loom.h"
#include "param.h"
#include "reduce.h"

enum { C_ALLREDUCE, C_BROADCAST, C_REDUCE, C_ALLGATHER, C_REDUCESCATTER, C_ALLTOALL, C_N };
static const char *cname[] = {"allreduce", "broadcast",     "reduce",
                              "allgather", "reducescatter", "alltoall"};
#define OP_PREMUL 5 /* test-local code for a pre-multiplied sum */

static bool is_unsigned(int t)
{
    return t == loomUint8 || t == loomUint32 || t == loomUint64;
}
static bool is_float(int t)
{
    return t >= loomFloat16 && t != loomUint64;
}
static bool is_fp8(int t)
{
    return t == loomFloat8e4m3 || t == loomFloat8e5m2;
}

static void put(int t, void *b, size_t i, double v)
{
    switch (t) {
    case loomInt8: ((int8_t *)b)[i] = (int8_t)v; break;
    case loomUint8: ((uint8_t *)b)[i] = (uint8_t)v; break;
    case loomInt32: ((int32_t *)b)[i] = (int32_t)v; break;
    case loomUint32: ((uint32_t *)b)[i] = (uint32_t)v; break;
    case loomInt64: ((int64_t *)b)[i] = (int64_t)v; break;
    case loomUint64: ((uint64_t *)b)[i] = (uint64_t)v; break;
    case loomFloat16: ((uint16_t *)b)[i] = red_float_to_half((float)v); break;
    case loomFloat32: ((float *)b)[i] = (float)v; break;
    case loomFloat64: ((double *)b)[i] = v; break;
    case loomBfloat16: ((uint16_t *)b)[i] = red_float_to_bf16((float)v); break;
    case loomFloat8e4m3:
    case loomFloat8e5m2: ((uint8_t *)b)[i] = red_float_to_fp8((loomDataType_t)t, (float)v); break;
    }
}

/* Rank r's input element i. */
static double in_val(int t, int op, int r, size_t i, int p)
{
    if (op == loomProd) {
        if (i % (size_t)p != (size_t)r) return 1;
        if (is_unsigned(t)) return (i / (size_t)p) % 2 ? 3 : 2;
        return (i / (size_t)p) % 2 ? -1 : 2;
    }
    if (op == loomMax || op == loomMin) {
        int v = (int)((i * 7 + (size_t)r * 13) % 31);
        return is_unsigned(t) ? v : v - 15;
    }
    /* 8-bit floats hold every integer only up to 8 (E5M2) or 16 (E4M3): -1, 0 or 1 keeps every
     * partial sum of up to 8 ranks exact, doubled ones (pre-multiplied) too */
    if (is_fp8(t)) return (int)((i * 5 + (size_t)r * 3) % 3) - 1;
    int v = (int)((i * 5 + (size_t)r * 3) % 7);
    return is_unsigned(t) ? v : v - 3;
}

/* Element identity for data-moving collectives: distinct per (rank, index), exact in all types. */
static double id_val(int t, int r, size_t i)
{
    int v = (int)(((size_t)r * 31 + i * 7) % 97);
    return is_unsigned(t) ? v : v - 48;
}

static int pub_op(int op)
{
    return op == OP_PREMUL ? loomSum : op;
}

/* Reduced value of element i over p ranks. */
static void reduced(int t, int op, size_t i, int p, void *out, size_t oi)
{
    double acc = 0;
    for (int r = 0; r < p; r++) {
        double v = in_val(t, pub_op(op), r, i, p);
        if (op == OP_PREMUL) v *= 2;
        if (r == 0)
            acc = v;
        else if (op == loomProd)
            acc *= v;
        else if (op == loomMax)
            acc = v > acc ? v : acc;
        else if (op == loomMin)
            acc = v < acc ? v : acc;
        else
            acc += v;
    }
    if (op != loomAvg) {
        put(t, out, oi, acc);
        return;
    }
    if (!is_float(t)) {
        put(t, out, oi, (double)((int64_t)acc / p));
        if (is_unsigned(t)) put(t, out, oi, (double)((uint64_t)acc / (uint64_t)p));
    } else if (t == loomFloat64) {
        put(t, out, oi, acc / p);
    } else {
        /* float32 division, rounded once to the type */
        put(t, out, oi, (double)((float)acc / (float)p));
    }
}

typedef struct {
    int colls_mask;
    size_t big;
    long failures;
} grid_arg_t;

static int check_buf(const char *what, int r, const void *got, const void *want, size_t bytes)
{
    if (memcmp(got, want, bytes) == 0) return 0;
    const uint8_t *g = got, *w = want;
    size_t k = 0;
    while (k < bytes && g[k] == w[k])
        k++;
    fprintf(stderr, "rank %d: %s: byte %zu of %zu differs (got 0x%02x want 0x%02x)\n", r, what, k,
            bytes, g[k], w[k]);
    return 1;
}

/* Runs one collective case on this rank; returns the number of problems. */
static int one_case(loomComm_t comm, int r, int p, int c, int t, int op, size_t n, bool inplace,
                    int root)
{
    size_t es = red_type_size(t);
    size_t in_n = (c == C_REDUCESCATTER || c == C_ALLTOALL) ? n * (size_t)p : n;
    size_t out_n = (c == C_ALLGATHER || c == C_ALLTOALL) ? n * (size_t)p : n;
    size_t big_n = in_n > out_n ? in_n : out_n;
    uint8_t *sbuf = malloc(big_n * es + 16), *rbuf = malloc(big_n * es + 16);
    uint8_t *want = malloc(big_n * es + 16);
    memset(rbuf, 0x5a, big_n * es + 16);
    memset(sbuf, 0xa5, big_n * es + 16);
    bool reduces = c == C_ALLREDUCE || c == C_REDUCE || c == C_REDUCESCATTER;
    /* input */
    uint8_t *in = inplace ? rbuf : sbuf;
    if (inplace && c == C_ALLGATHER) in = rbuf + (size_t)r * n * es;
    for (size_t i = 0; i < in_n; i++) {
        double v;
        if (reduces) {
            size_t gi = i;
            v = in_val(t, pub_op(op), r, gi, p);
        } else if (c == C_ALLTOALL) {
            v = id_val(t, r, i);
        } else {
            v = id_val(t, r, i);
        }
        put(t, in, i, v);
    }
    void *send = in, *recv = rbuf;
    if (inplace && c == C_REDUCESCATTER) recv = rbuf + (size_t)r * n * es;
    if (inplace && c == C_ALLGATHER) recv = rbuf;
    /* expected output */
    memcpy(want, rbuf, big_n * es + 16);
    uint8_t *wout = want + ((uint8_t *)recv - rbuf);
    bool has_out = !(c == C_REDUCE && r != root);
    if (has_out) {
        for (size_t i = 0; i < out_n; i++) {
            switch (c) {
            case C_ALLREDUCE:
            case C_REDUCE: reduced(t, op, i, p, wout, i); break;
            case C_REDUCESCATTER: reduced(t, op, (size_t)r * n + i, p, wout, i); break;
            case C_BROADCAST: put(t, wout, i, id_val(t, root, i)); break;
            case C_ALLGATHER: put(t, wout, i, id_val(t, (int)(i / n), i % n)); break;
            case C_ALLTOALL: put(t, wout, i, id_val(t, (int)(i / n), (size_t)r * n + i % n)); break;
            }
        }
    }
    loomRedOp_t lop = (loomRedOp_t)op;
    if (op == OP_PREMUL) {
        uint8_t scalar[8];
        put(t, scalar, 0, 2);
        loomResult_t rr = loomRedOpCreatePreMulSum(&lop, scalar, t, loomScalarHostImmediate, comm);
        if (rr != loomSuccess) {
            fprintf(stderr, "rank %d: premulsum create failed: %s\n", r, loomGetLastError(NULL));
            return 1;
        }
    }
    loomResult_t res = loomSuccess;
    switch (c) {
    case C_ALLREDUCE: res = loomAllReduce(send, recv, n, t, lop, comm, NULL); break;
    case C_BROADCAST: res = loomBroadcast(send, recv, n, t, root, comm, NULL); break;
    case C_REDUCE: res = loomReduce(send, recv, n, t, lop, root, comm, NULL); break;
    case C_ALLGATHER: res = loomAllGather(send, recv, n, t, comm, NULL); break;
    case C_REDUCESCATTER: res = loomReduceScatter(send, recv, n, t, lop, comm, NULL); break;
    case C_ALLTOALL: res = loomAlltoAll(send, recv, n, t, comm, NULL); break;
    }
    if (op == OP_PREMUL) loomRedOpDestroy(lop, comm);
    int bad = 0;
    char what[160];
    snprintf(what, sizeof(what), "%s %s op %d count %zu %s root %d on %d ranks", cname[c],
             red_type_name(t), op, n, inplace ? "in place" : "out of place", root, p);
    if (res != loomSuccess) {
        fprintf(stderr, "rank %d: %s failed: %s\n", r, what, loomGetLastError(NULL));
        bad = 1;
    } else {
        /* The whole receive buffer: the result, and nothing written outside it. */
        bad = check_buf(what, r, rbuf, want, big_n * es + 16);
    }
    free(sbuf);
    free(rbuf);
    free(want);
    return bad;
}

static int grid_rank(loomComm_t comm, int r, int p, void *argp)
{
    grid_arg_t *a = argp;
    size_t counts[] = {0, 1, (size_t)(p > 1 ? p - 1 : 2), (size_t)p, (size_t)p + 1, a->big};
    int bad = 0;
    for (int c = 0; c < C_N; c++) {
        if (!(a->colls_mask & (1 << c))) continue;
        bool reduces = c == C_ALLREDUCE || c == C_REDUCE || c == C_REDUCESCATTER;
        for (int t = 0; t < loomNumTypes; t++) {
            int nops = reduces ? 6 : 1;
            for (int op = 0; op < nops; op++) {
                for (size_t k = 0; k < sizeof(counts) / sizeof(counts[0]); k++) {
                    /* the big count once per type and collective, with sum (and every op for
                     * float32) to keep the grid fast */
                    if (k == 5 && op != 0 && t != loomFloat32) continue;
                    for (int ip = 0; ip < 2; ip++) {
                        int root = (int)((k + (size_t)op) % (size_t)p);
                        bad += one_case(comm, r, p, c, t, op, counts[k], ip, root);
                        if (bad > 5) return bad;
                    }
                }
            }
        }
    }
    return bad;
}

static void run_grid(int p, int mask, size_t big)
{
    grid_arg_t a = {.colls_mask = mask, .big = big};
    int bad = h_run_threads(p, grid_rank, &a);
    ck_assert_msg(bad == 0, "%d of %d ranks saw wrong results (see stderr)", bad, p);
}

/* Small slices and two channels, so that the grid's counts cross slice and channel borders. */
static void small_slices(void)
{
    setenv("LOOM_SLICE_SIZE", "4K", 1);
    setenv("LOOM_NCHANNELS", "2", 1);
    param_reset_cache();
}

#define ALL_COLLS ((1 << C_N) - 1)

START_TEST(grid_reducing)
{
    static const int ranks[] = {1, 2, 3, 4, 5, 7, 8};
    small_slices();
    run_grid(ranks[_i], (1 << C_ALLREDUCE) | (1 << C_REDUCE) | (1 << C_REDUCESCATTER), 5003);
}
END_TEST

START_TEST(grid_moving)
{
    static const int ranks[] = {1, 2, 3, 4, 5, 7, 8};
    small_slices();
    run_grid(ranks[_i], (1 << C_BROADCAST) | (1 << C_ALLGATHER) | (1 << C_ALLTOALL), 5003);
}
END_TEST

static int big_rank(loomComm_t comm, int r, int p, void *arg)
{
    (void)arg;
    /* Default parameters: several default slices per chunk, a count that divides by nothing. */
    int bad = one_case(comm, r, p, C_ALLREDUCE, loomFloat32, loomSum, (1u << 20) + 3, false, 0);
    bad += one_case(comm, r, p, C_ALLREDUCE, loomBfloat16, loomSum, (1u << 20) + 3, true, 0);
    bad += one_case(comm, r, p, C_ALLREDUCE, loomInt64, loomMax, 300007, false, 0);
    return bad;
}

START_TEST(big_counts)
{
    unsetenv("LOOM_SLICE_SIZE");
    unsetenv("LOOM_NCHANNELS");
    param_reset_cache();
    static const int ranks[] = {2, 3, 4};
    int bad = h_run_threads(ranks[_i], big_rank, NULL);
    ck_assert_int_eq(bad, 0);
}
END_TEST

/* Back-to-back collectives of different shapes must not mix messages across calls. */
static int mixed_rank(loomComm_t comm, int r, int p, void *arg)
{
    (void)arg;
    int bad = 0;
    for (int it = 0; it < 30; it++) {
        int c = it % C_N;
        size_t n = (size_t)(it * 37 % 101) + 1;
        bad += one_case(comm, r, p, c, it % loomNumTypes, it % 5 % 4, n, it % 2, it % p);
    }
    return bad;
}

START_TEST(mixed_sequence)
{
    small_slices();
    ck_assert_int_eq(h_run_threads(5, mixed_rank, NULL), 0);
}
END_TEST

/* Hierarchical and parameter-server allreduce over pretend nodes (LOOM_NODE_ID lists a node
 * name per rank), uneven layouts included: every type and op, in place and out of place. */
static int algo_rank(loomComm_t comm, int r, int p, void *arg)
{
    (void)arg;
    size_t counts[] = {0, 1, (size_t)p - 1, (size_t)p, (size_t)p + 1, 5003};
    int bad = 0;
    for (int t = 0; t < loomNumTypes; t++)
        for (int op = 0; op < 6; op++)
            for (size_t k = 0; k < sizeof(counts) / sizeof(counts[0]); k++)
                for (int ip = 0; ip < 2; ip++) {
                    bad += one_case(comm, r, p, C_ALLREDUCE, t, op, counts[k], ip, 0);
                    if (bad > 5) return bad;
                }
    return bad;
}

static const char *const coll_algos[] = {
    "hier",      "hier_leader",       "ps",      "ring",    "rd",     "rabenseifner", "tree",
    "hier:tree", "hier:rabenseifner", "hier:rd", "oneshot", "segment"};
#define NCOLL_ALGOS ((int)(sizeof(coll_algos) / sizeof(coll_algos[0])))

START_TEST(hier_algos)
{
    const char *const *algos = coll_algos;
    /* 2..8 ranks, powers of two and not, one node and several, uneven nodes */
    static const struct {
        int p;
        const char *nodes;
    } layouts[] = {{4, "a,a,b,b"}, {5, "a,b,a,b,b"},     {6, "a,a,a,b,c,c"},
                   {3, "a,b,c"},   {7, "a,a,a,a,a,a,a"}, {8, "a,a,a,a,b,b,b,b"},
                   {2, "a,a"},     {6, "a,a,a,a,a,a"}};
    small_slices();
    for (size_t l = 0; l < sizeof(layouts) / sizeof(layouts[0]); l++) {
        setenv("LOOM_ALGO", algos[_i], 1);
        setenv("LOOM_NODE_ID", layouts[l].nodes, 1);
        param_reset_cache();
        int bad = h_run_threads(layouts[l].p, algo_rank, NULL);
        ck_assert_msg(bad == 0, "LOOM_ALGO=%s, nodes %s: %d ranks saw wrong results", algos[_i],
                      layouts[l].nodes, bad);
    }
    unsetenv("LOOM_ALGO");
    unsetenv("LOOM_NODE_ID");
    param_reset_cache();
}
END_TEST

/* Reduce and broadcast with LOOM_ALGO=ring and =tree (the double binary tree) on 2..9 ranks:
 * every type and op, counts 0, 1, p-1, p, p+1, primes and a large one, every root for the small
 * counts (the tree's shape turns with the root), in place and out of place, bit for bit. */
static int rooted_rank(loomComm_t comm, int r, int p, void *arg)
{
    (void)arg;
    size_t counts[] = {0, 1, (size_t)p - 1, (size_t)p, (size_t)p + 1, 13, 4099, 100003};
    int ncounts = (int)(sizeof(counts) / sizeof(counts[0])), bad = 0;
    for (int c = C_BROADCAST; c <= C_REDUCE; c++)
        for (int t = 0; t < loomNumTypes; t++)
            for (int op = 0; op < (c == C_REDUCE ? 6 : 1); op++)
                for (int k = 0; k < ncounts; k++) {
                    /* 8-bit floats hold the partial sums of in_val's inputs exactly up to 8
                     * ranks only (9 is not an E5M2 value) */
                    if (c == C_REDUCE && is_fp8(t) && p > 8) continue;
                    bool big = counts[k] > 1000;
                    /* the big counts with sum (every op for float32), at the two end roots */
                    if (big && op != 0 && t != loomFloat32) continue;
                    for (int root = 0; root < p; root += big && p > 1 ? p - 1 : 1)
                        for (int ip = 0; ip < 2; ip++) {
                            bad += one_case(comm, r, p, c, t, op, counts[k], ip, root);
                            if (bad > 5) return bad;
                        }
                }
    return bad;
}

static const char *const rooted_algos[] = {"ring", "tree"};

START_TEST(rooted_algos_grid)
{
    const char *algo = rooted_algos[_i / 8];
    int p = 2 + _i % 8;
    small_slices();
    setenv("LOOM_ALGO", algo, 1);
    param_reset_cache();
    int bad = h_run_threads(p, rooted_rank, NULL);
    unsetenv("LOOM_ALGO");
    param_reset_cache();
    ck_assert_msg(bad == 0, "LOOM_ALGO=%s, %d ranks: %d ranks saw wrong results", algo, p, bad);
}
END_TEST

int main(void)
{
    setenv("LOOM_SOCKET_IFNAME", "lo", 0);
    Suite *s = suite_create("coll");
    /* Cases of their own, so that a run can pick some (CK_RUN_CASE=mixed: scripts/sanitize.sh). */
    TCase *tc = tcase_create("grid");
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, grid_reducing, 0, 7);
    tcase_add_loop_test(tc, grid_moving, 0, 7);
    suite_add_tcase(s, tc);
    TCase *big = tcase_create("big");
    tcase_set_timeout(big, 600);
    tcase_add_loop_test(big, big_counts, 0, 3);
    suite_add_tcase(s, big);
    TCase *mixed = tcase_create("mixed");
    tcase_set_timeout(mixed, 600);
    tcase_add_test(mixed, mixed_sequence);
    suite_add_tcase(s, mixed);
    TCase *algos = tcase_create("algos");
    tcase_set_timeout(algos, 600);
    tcase_add_loop_test(algos, hier_algos, 0, NCOLL_ALGOS);
    suite_add_tcase(s, algos);
    TCase *rooted = tcase_create("rooted");
    tcase_set_timeout(rooted, 600);
    tcase_add_loop_test(rooted, rooted_algos_grid, 0, 16);
    suite_add_tcase(s, rooted);
    return h_check_main(s, false, CK_NORMAL);
}
