/*
 * LOOM_SECURE=1 (the TCP transport's sealed frames, src/transport/tcp/seal.h): ranks that
 * disagree on the setting fail on both sides naming it; a record damaged or replayed on the wire
 * (the transport's test-only tamper hook, frame.h) fails the operation on both ranks, naming the
 * peer and the cause, and never yields a wrong sum; data crossing record borders arrives exact
 * over one to three sockets per peer; records open only under their own number, kind, direction
 * and transcript, across the rekeying border too. The collective grid itself runs sealed as the
 * meson test coll-secure, and the transport failure cases as fail-secure.
 */
#include <check.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "loom.h"
#include "param.h"
#include "tcp/frame.h"

#define TEXT_MAX 1024
#define MAX_RANKS 4

/* What each forked rank reports. */
typedef struct {
    int init_rc;         /* loomCommInitRank's result */
    int rc;              /* the first failing call's result (0: every call succeeded) */
    int iter;            /* the iteration that failed, -1: none */
    int wrong;           /* elements that differed from the exact sum in a call that succeeded */
    char text[TEXT_MAX]; /* the failing call's error text */
} report_t;

typedef struct {
    int nranks;
    const char *secure[MAX_RANKS]; /* LOOM_SECURE per rank (NULL: unset) */
    int tamper_rank;               /* -1: none */
    tcp_tamper_what_t tamper_what;
    uint64_t tamper_nth;
    size_t count;  /* floats per allreduce */
    int iters;     /* allreduces */
    int nsocks;    /* LOOM_NSOCKS_PERPEER */
    report_t *rep; /* shared, one per rank */
} job_t;

static float val(int r, size_t i, int it)
{
    return (float)((int)((i * 7 + (size_t)r * 3 + (size_t)it) % 13) - 6);
}

/* A rank's body in its own process: init, then allreduces checked element by element. */
static int rank_main(job_t *j, const loomUniqueId *id, int r)
{
    report_t *rep = &j->rep[r];
    rep->iter = -1;
    setenv("LOOM_TRANSPORT", "tcp", 1);
    setenv("LOOM_TIMEOUT", "10", 1);
    char ns[8];
    snprintf(ns, sizeof(ns), "%d", j->nsocks ? j->nsocks : 2);
    setenv("LOOM_NSOCKS_PERPEER", ns, 1);
    if (j->secure[r])
        setenv("LOOM_SECURE", j->secure[r], 1);
    else
        unsetenv("LOOM_SECURE");
    param_reset_cache();
    if (r == j->tamper_rank) {
        tcp_tamper.what = j->tamper_what;
        tcp_tamper.nth = j->tamper_nth;
        tcp_tamper.seen = 0;
    }
    loomComm_t comm = NULL;
    loomResult_t res = loomCommInitRank(&comm, j->nranks, *id, r);
    rep->init_rc = res;
    if (res != loomSuccess) {
        snprintf(rep->text, sizeof(rep->text), "%s", loomGetLastError(NULL));
        rep->rc = res;
        return 1;
    }
    float *send = malloc(j->count * sizeof(float)), *recv = malloc(j->count * sizeof(float));
    for (int it = 0; it < j->iters && rep->rc == 0; it++) {
        for (size_t i = 0; i < j->count; i++)
            send[i] = val(r, i, it);
        memset(recv, 0xff, j->count * sizeof(float));
        res = loomAllReduce(send, recv, j->count, loomFloat32, loomSum, comm, NULL);
        if (res != loomSuccess) {
            rep->rc = res;
            rep->iter = it;
            const char *c = loomGetLastError(comm), *t = loomGetLastError(NULL);
            if (c[0] && strcmp(c, t) != 0)
                snprintf(rep->text, sizeof(rep->text), "%s || %s", c, t);
            else
                snprintf(rep->text, sizeof(rep->text), "%s", t);
            break;
        }
        for (size_t i = 0; i < j->count; i++) {
            float want = 0;
            for (int q = 0; q < j->nranks; q++)
                want += val(q, i, it);
            if (memcmp(&want, &recv[i], sizeof(float)) != 0) rep->wrong++;
        }
    }
    free(send);
    free(recv);
    if (getenv("SECURE_TEST_DEBUG"))
        fprintf(stderr, "rank %d: tamper saw %llu records\n", r,
                (unsigned long long)tcp_tamper.seen);
    if (rep->rc != 0)
        loomCommAbort(comm);
    else
        loomCommDestroy(comm);
    return rep->rc != 0 || rep->wrong != 0;
}

static int rank_body(int r, const loomUniqueId *id, void *p)
{
    return rank_main(p, id, r);
}

/* Forks the job's ranks (the harness: the id is made after the forks) and waits at most
 * timeout_s; a rank left then is killed and fails the test. */
static void run_job(job_t *j, int timeout_s)
{
    j->rep = mmap(NULL, sizeof(report_t) * MAX_RANKS, PROT_READ | PROT_WRITE,
                  MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    ck_assert(j->rep != MAP_FAILED);
    memset(j->rep, 0, sizeof(report_t) * MAX_RANKS);
    int status[MAX_RANKS];
    h_fork_procs(j->nranks, rank_body, j, timeout_s, status);
    for (int r = 0; r < j->nranks; r++)
        ck_assert_msg(status[r] != -1, "rank %d did not finish within %d s", r, timeout_s);
}

/* ---- both sides must agree ---- */

START_TEST(test_mismatch)
{
    /* _i: which rank is the sealed one; 2 and 3: a third rank joins (both kinds of pairs). */
    job_t j = {.nranks = _i < 2 ? 2 : 3, .tamper_rank = -1, .count = 1024, .iters = 2};
    for (int r = 0; r < j.nranks; r++)
        j.secure[r] = (r == _i % 2) ? "1" : "0";
    if (_i == 3) j.secure[2] = NULL; /* unset means off */
    run_job(&j, 40);
    int sealed = _i % 2;
    for (int r = 0; r < j.nranks; r++) {
        report_t *p = &j.rep[r];
        ck_assert_msg(p->rc != 0,
                      "rank %d: every call succeeded although ranks disagree on "
                      "LOOM_SECURE",
                      r);
        ck_assert_msg(p->wrong == 0, "rank %d: %d wrong elements", r, p->wrong);
        ck_assert_msg(strstr(p->text, "LOOM_SECURE") != NULL,
                      "rank %d's error does not name LOOM_SECURE: %s", r, p->text);
        /* The sealed rank names a plain peer; a plain rank names the sealed one (directly, or
         * in the reason another rank forwarded). */
        ck_assert_msg(strstr(p->text, "LOOM_SECURE=1") && strstr(p->text, "LOOM_SECURE=0"),
                      "rank %d: %s", r, p->text);
        bool named = false;
        for (int q = 0; q < j.nranks; q++)
            if (q != r && (r == sealed || q == sealed) && h_names_rank(p->text, q)) named = true;
        ck_assert_msg(named, "rank %d's error does not name a peer that disagrees: %s", r, p->text);
    }
}
END_TEST

/* ---- damage on the wire ---- */

static void check_tampered(job_t *j)
{
    int victim = 1 - j->tamper_rank; /* the receiver of the damaged record */
    for (int r = 0; r < j->nranks; r++) {
        report_t *p = &j->rep[r];
        ck_assert_msg(p->wrong == 0, "rank %d: %d wrong elements after tampering", r, p->wrong);
        ck_assert_msg(p->init_rc == loomSuccess, "rank %d: init failed: %s", r, p->text);
        ck_assert_msg(p->rc != 0, "rank %d: a tampered record went unnoticed", r);
        ck_assert_msg(strstr(p->text, "failed authentication") != NULL,
                      "rank %d's error does not say what happened: %s", r, p->text);
        ck_assert_msg(h_names_rank(p->text, r == victim ? j->tamper_rank : victim),
                      "rank %d's error does not name its peer: %s", r, p->text);
    }
    ck_assert_msg(strstr(j->rep[victim].text, "127.0.0.1") != NULL,
                  "the error does not name the peer's address: %s", j->rep[victim].text);
    ck_assert_msg(strstr(j->rep[victim].text, "frame ") != NULL &&
                      strstr(j->rep[victim].text, "record ") != NULL,
                  "the error does not name the frame and record: %s", j->rep[victim].text);
}

START_TEST(test_tamper_flip)
{
    /* The nth record rank 0 seals: a header (1), payload records, headers of later frames. */
    static const uint64_t nth[] = {1, 2, 3, 7, 20, 41};
    job_t j = {.nranks = 2,
               .secure = {"1", "1"},
               .tamper_rank = 0,
               .tamper_what = TCP_TAMPER_FLIP,
               .tamper_nth = nth[_i],
               .count = 100000,
               .iters = 6};
    run_job(&j, 40);
    check_tampered(&j);
}
END_TEST

START_TEST(test_tamper_replay)
{
    static const uint64_t nth[] = {2, 9, 15};
    job_t j = {.nranks = 2,
               .secure = {"1", "1"},
               .tamper_rank = _i % 2,
               .tamper_what = TCP_TAMPER_REPLAY,
               .tamper_nth = nth[_i],
               .count = 40000,
               .iters = 6};
    run_job(&j, 40);
    check_tampered(&j);
}
END_TEST

/* ---- sealed data over several sockets, record borders crossed ---- */

START_TEST(test_sealed_sizes)
{
    /* _i: sockets per peer 1..3; counts around the 64 KiB record size and beyond 1 MiB. */
    static const size_t counts[] = {0, 1, 16383, 16384, 16385, 32768 + 5, 300007};
    for (size_t k = 0; k < sizeof(counts) / sizeof(counts[0]); k++) {
        job_t j = {.nranks = 2 + (int)k % 3,
                   .secure = {"1", "1", "1", "1"},
                   .tamper_rank = -1,
                   .count = counts[k],
                   .iters = 3,
                   .nsocks = _i + 1};
        run_job(&j, 60);
        for (int r = 0; r < j.nranks; r++)
            ck_assert_msg(j.rep[r].rc == 0 && j.rep[r].wrong == 0,
                          "%d ranks, %zu floats, %d sockets: rank %d: rc %d, %d wrong: %s",
                          j.nranks, counts[k], j.nsocks, r, j.rep[r].rc, j.rep[r].wrong,
                          j.rep[r].text);
    }
}
END_TEST

/* ---- nothing leaves the node unsealed ---- */

START_TEST(test_other_transports)
{
    /* _i: LOOM_TRANSPORT=ucx or mpi with LOOM_SECURE=1 is refused at init (whether or not
     * this build has them); unset, the job runs (tcp across nodes, shm inside one). */
    static const char *const names[] = {"ucx", "mpi", ""};
    if (names[_i][0])
        setenv("LOOM_TRANSPORT", names[_i], 1);
    else
        unsetenv("LOOM_TRANSPORT");
    setenv("LOOM_SECURE", "1", 1);
    param_reset_cache();
    loomUniqueId id;
    ck_assert_int_eq(loomGetUniqueId(&id), loomSuccess);
    loomComm_t comm = NULL;
    loomResult_t r = loomCommInitRank(&comm, 1, id, 0);
    const char *t = loomGetLastError(NULL);
    if (names[_i][0]) {
        ck_assert_msg(r == loomInvalidUsage, "LOOM_TRANSPORT=%s: init gave %d", names[_i], r);
        ck_assert_msg(strstr(t, "LOOM_SECURE=1") && strstr(t, names[_i]), "%s", t);
    } else {
        ck_assert_msg(r == loomSuccess, "%s", t);
        loomCommDestroy(comm);
    }
    unsetenv("LOOM_TRANSPORT");
    unsetenv("LOOM_SECURE");
    param_reset_cache();
}
END_TEST

/* ---- the records themselves (seal.c) ---- */

static const uint8_t unit_key[16] = "unit-test-secret";

static void unit_pair(seal_dir_t *tx, seal_dir_t *rx, seal_alg_t alg, const char *transcript,
                      int tx_dir, int rx_dir)
{
    ck_assert_int_eq(seal_init(tx, alg, unit_key, transcript, strlen(transcript), tx_dir),
                     loomSuccess);
    ck_assert_int_eq(seal_init(rx, alg, unit_key, transcript, strlen(transcript), rx_dir),
                     loomSuccess);
}

START_TEST(test_records)
{
    /* _i: 0 ChaCha20-Poly1305, 1 AES-256-GCM (where this machine has it) */
    seal_alg_t alg = _i ? SEAL_AES256GCM : SEAL_CHACHA20POLY1305;
    if (alg == SEAL_AES256GCM && !seal_aes_available()) return;
    uint8_t msg[300], buf[300], tag[SEAL_TAG_BYTES];
    for (size_t i = 0; i < sizeof(msg); i++)
        msg[i] = (uint8_t)(i * 31 + 7);
    seal_dir_t tx, rx;
    /* Across the rekeying border: each record opens as its own number, and only as it. */
    unit_pair(&tx, &rx, alg, "transcript A", 0, 0);
    tx.ctr = SEAL_EPOCH_RECORDS - 2;
    uint8_t key0[32];
    for (uint64_t ctr = SEAL_EPOCH_RECORDS - 2; ctr < SEAL_EPOCH_RECORDS + 2; ctr++) {
        seal_close(&tx, SEAL_KIND_DATA, msg, sizeof(msg), buf, tag);
        if (ctr == SEAL_EPOCH_RECORDS - 1) memcpy(key0, tx.key, sizeof(key0));
        if (ctr == SEAL_EPOCH_RECORDS)
            ck_assert_msg(memcmp(key0, tx.key, sizeof(key0)) != 0, "no new key at the border");
        ck_assert(memcmp(buf, msg, sizeof(msg)) != 0); /* encrypted */
        uint8_t copy[300];
        memcpy(copy, buf, sizeof(copy));
        ck_assert_msg(!seal_open(&rx, ctr + 1, SEAL_KIND_DATA, copy, sizeof(copy), tag),
                      "record %llu opened as the next one", (unsigned long long)ctr);
        memcpy(copy, buf, sizeof(copy));
        ck_assert_msg(!seal_open(&rx, ctr, SEAL_KIND_HEADER, copy, sizeof(copy), tag),
                      "a data record opened as a header");
        ck_assert_msg(seal_open(&rx, ctr, SEAL_KIND_DATA, buf, sizeof(buf), tag),
                      "record %llu did not open", (unsigned long long)ctr);
        ck_assert(memcmp(buf, msg, sizeof(msg)) == 0);
    }
    ck_assert(tx.ctr == SEAL_EPOCH_RECORDS + 2);
    /* The other direction's key, another transcript's key: nothing opens. */
    seal_dir_t tx2, rx2;
    unit_pair(&tx2, &rx2, alg, "transcript A", 0, 1); /* a record reflected back to its sender */
    seal_close(&tx2, SEAL_KIND_DATA, msg, sizeof(msg), buf, tag);
    ck_assert(!seal_open(&rx2, 0, SEAL_KIND_DATA, buf, sizeof(buf), tag));
    unit_pair(&tx2, &rx2, alg, "transcript B", 0, 0);
    memcpy(buf, msg, sizeof(buf));
    seal_close(&tx, SEAL_KIND_DATA, msg, sizeof(msg), buf, tag);
    ck_assert(!seal_open(&rx2, tx.ctr - 1, SEAL_KIND_DATA, buf, sizeof(buf), tag));
    /* Sealing twice never repeats a nonce: the same text gives different ciphertexts. */
    uint8_t a[300], b[300], ta[SEAL_TAG_BYTES], tb[SEAL_TAG_BYTES];
    seal_close(&tx, SEAL_KIND_DATA, msg, sizeof(msg), a, ta);
    seal_close(&tx, SEAL_KIND_DATA, msg, sizeof(msg), b, tb);
    ck_assert(memcmp(a, b, sizeof(a)) != 0 && memcmp(ta, tb, sizeof(ta)) != 0);
    seal_wipe(&tx);
    seal_wipe(&rx);
    seal_wipe(&tx2);
    seal_wipe(&rx2);
}
END_TEST

/* LOOM_SECURE outside 0..1: a warning, and the default (off) is used; both ranks agree. */
START_TEST(test_bad_value)
{
    /* A value other than 0 or 1 fails init on the rank that has it, naming it: a job that asked
     * for encryption with a typo ("yes", "2", "on") must not run in clear (it used to warn and
     * run unsealed). */
    const char *bad[] = {"2", "yes", "on"};
    for (size_t b = 0; b < sizeof(bad) / sizeof(bad[0]); b++) {
        job_t j = {
            .nranks = 2, .secure = {bad[b], bad[b]}, .tamper_rank = -1, .count = 100, .iters = 1};
        run_job(&j, 40);
        for (int r = 0; r < 2; r++) {
            char want[64];
            snprintf(want, sizeof(want), "LOOM_SECURE=%s: expected 0", bad[b]);
            ck_assert_msg(j.rep[r].init_rc == loomInvalidUsage && strstr(j.rep[r].text, want),
                          "LOOM_SECURE=%s, rank %d: init %d: %s", bad[b], r, j.rep[r].init_rc,
                          j.rep[r].text);
        }
    }
    setenv("LOOM_SECURE", "1", 1);
    param_reset_cache();
    ck_assert_str_eq(param_str(PARAM_SECURE), "1");
    unsetenv("LOOM_SECURE");
    param_reset_cache();
}
END_TEST

int main(void)
{
    setenv("LOOM_SOCKET_IFNAME", "lo", 0);
    Suite *s = suite_create("secure");
    TCase *tc = tcase_create("secure");
    tcase_set_timeout(tc, 240);
    tcase_add_loop_test(tc, test_mismatch, 0, 4);
    tcase_add_loop_test(tc, test_tamper_flip, 0, 6);
    tcase_add_loop_test(tc, test_tamper_replay, 0, 3);
    tcase_add_loop_test(tc, test_sealed_sizes, 0, 3);
    tcase_add_test(tc, test_bad_value);
    tcase_add_loop_test(tc, test_records, 0, 2);
    tcase_add_loop_test(tc, test_other_transports, 0, 3);
    suite_add_tcase(s, tc);
    return h_check_main(s, true, CK_NORMAL);
}
