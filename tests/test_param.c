/*
 * Parameters (src/base/param.c): every value read from the environment is checked against the
 * range in the table; a bad one is a WARN line naming the variable, the value, the range and
 * what is used instead. Each test runs in its own process (Check's fork mode), sets the
 * environment, and forgets the cache with param_reset_cache.
 */
#include <check.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base.h"
#include "harness.h"
#include "param.h"

/* stderr of the test, captured in a temporary file so that WARN lines can be checked. */
static FILE *cap;
static int saved_err = -1;

static void capture_start(void)
{
    fflush(stderr);
    cap = tmpfile();
    ck_assert_ptr_nonnull(cap);
    saved_err = dup(2);
    dup2(fileno(cap), 2);
}

/* What was written since capture_start (static buffer). */
static const char *capture_end(void)
{
    static char buf[16384];
    fflush(stderr);
    dup2(saved_err, 2);
    close(saved_err);
    rewind(cap);
    size_t n = fread(buf, 1, sizeof(buf) - 1, cap);
    buf[n] = '\0';
    fclose(cap);
    fputs(buf, stderr); /* still visible in the test's log */
    return buf;
}

static void set_param(const char *name, const char *value)
{
    if (value)
        setenv(name, value, 1);
    else
        unsetenv(name);
    param_reset_cache();
}

/* Asserts that `log` has one line holding every one of the NULL-terminated words. */
static void assert_line_has(const char *log, const char *const *words)
{
    const char *p = log;
    while (*p) {
        const char *e = strchr(p, '\n');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        char line[4096];
        snprintf(line, sizeof(line), "%.*s", (int)n, p);
        bool all = true;
        for (const char *const *w = words; *w; w++)
            all &= strstr(line, *w) != NULL;
        if (all) return;
        p += n + (e ? 1 : 0);
    }
    char want[512] = "";
    for (const char *const *w = words; *w; w++)
        snprintf(want + strlen(want), sizeof(want) - strlen(want), "'%s' ", *w);
    ck_abort_msg("no log line holds all of %s; the log:\n%s", want, log);
}

#define LINE_HAS(log, ...) assert_line_has((log), (const char *const[]){__VA_ARGS__, NULL})

START_TEST(test_timeout_negative)
{
    set_param("LOOM_TIMEOUT", "-1");
    capture_start();
    double t = param_double(PARAM_TIMEOUT);
    const char *log = capture_end();
    ck_assert_msg(t == 30.0, "LOOM_TIMEOUT=-1 gave %g s, not the default 30", t);
    LINE_HAS(log, "WARN", "LOOM_TIMEOUT", "'-1'", "0.1", "default 30");
}
END_TEST

START_TEST(test_timeout_nan)
{
    set_param("LOOM_TIMEOUT", "nan");
    capture_start();
    double t = param_double(PARAM_TIMEOUT);
    const char *log = capture_end();
    ck_assert_msg(t == 30.0, "LOOM_TIMEOUT=nan gave %g s, not the default 30", t);
    LINE_HAS(log, "WARN", "LOOM_TIMEOUT", "'nan'", "default 30");
}
END_TEST

/* inf means no limit, held as a finite number of seconds that converts to nanoseconds safely
 * (2^64 ns are 584 years). */
START_TEST(test_timeout_inf)
{
    const char *inf[] = {"inf", "INF", "Infinity"};
    for (size_t i = 0; i < sizeof(inf) / sizeof(inf[0]); i++) {
        set_param("LOOM_TIMEOUT", inf[i]);
        capture_start();
        double t = param_double(PARAM_TIMEOUT);
        const char *log = capture_end();
        ck_assert_msg(isfinite(t) && t >= 1e8 && t * 1e9 < 1.8e19,
                      "LOOM_TIMEOUT=%s gave %g s: not a finite no-limit value", inf[i], t);
        ck_assert_msg(strstr(log, "WARN") == NULL, "LOOM_TIMEOUT=%s warned: %s", inf[i], log);
    }
    set_param("LOOM_HANDSHAKE_TIMEOUT", "inf");
    double h = param_double(PARAM_HANDSHAKE_TIMEOUT);
    ck_assert_msg(isfinite(h) && h >= 1e8, "LOOM_HANDSHAKE_TIMEOUT=inf gave %g", h);
    /* -inf is no limit of anything */
    set_param("LOOM_TIMEOUT", "-inf");
    capture_start();
    double t = param_double(PARAM_TIMEOUT);
    const char *log = capture_end();
    ck_assert_msg(t == 30.0, "LOOM_TIMEOUT=-inf gave %g", t);
    LINE_HAS(log, "WARN", "LOOM_TIMEOUT", "'-inf'");
}
END_TEST

START_TEST(test_handshake_zero)
{
    set_param("LOOM_HANDSHAKE_TIMEOUT", "0");
    capture_start();
    double t = param_double(PARAM_HANDSHAKE_TIMEOUT);
    const char *log = capture_end();
    ck_assert_msg(t == 5.0, "LOOM_HANDSHAKE_TIMEOUT=0 gave %g s, not the default 5", t);
    LINE_HAS(log, "WARN", "LOOM_HANDSHAKE_TIMEOUT", "'0'", "default 5");
}
END_TEST

START_TEST(test_nchannels_clamped)
{
    set_param("LOOM_NCHANNELS", "0");
    capture_start();
    int64_t n = param_int(PARAM_NCHANNELS);
    const char *log = capture_end();
    ck_assert_int_eq(n, 1);
    LINE_HAS(log, "WARN", "LOOM_NCHANNELS", "'0'", "[1, 16]", "using 1");
    set_param("LOOM_NCHANNELS", "100000");
    capture_start();
    n = param_int(PARAM_NCHANNELS);
    log = capture_end();
    ck_assert_int_eq(n, 16);
    LINE_HAS(log, "WARN", "LOOM_NCHANNELS", "'100000'", "[1, 16]", "using 16");
    /* in range: no word */
    set_param("LOOM_NCHANNELS", "3");
    capture_start();
    n = param_int(PARAM_NCHANNELS);
    log = capture_end();
    ck_assert_int_eq(n, 3);
    ck_assert_msg(strstr(log, "WARN") == NULL, "LOOM_NCHANNELS=3 warned: %s", log);
}
END_TEST

/* A frame limit below what loom itself sends is raised to the smallest that works, with a word,
 * instead of failing the first large message as a "malformed frame" from the peer. */
static int bigmsg_rank(loomComm_t comm, int rank, int nranks, void *arg)
{
    (void)arg;
    enum { N = 300000 };
    float *a = malloc(N * sizeof(float)), *b = malloc(N * sizeof(float));
    int rc = 1;
    if (!a || !b) goto out;
    for (int i = 0; i < N; i++)
        a[i] = (float)(rank + 1);
    loomResult_t r = loomAllReduce(a, b, N, loomFloat, loomSum, comm, NULL);
    if (r != loomSuccess) {
        fprintf(stderr, "rank %d: allreduce: %s\n", rank, loomGetLastError(NULL));
        goto out;
    }
    for (int i = 0; i < N; i++)
        if (b[i] != (float)(nranks * (nranks + 1) / 2)) {
            fprintf(stderr, "rank %d: element %d is %g\n", rank, i, (double)b[i]);
            goto out;
        }
    loomGroupStart();
    if (rank == 0) loomSend(a, N, loomFloat, 1, comm, NULL);
    if (rank == 1) loomRecv(b, N, loomFloat, 0, comm, NULL);
    r = loomGroupEnd();
    if (r != loomSuccess) {
        fprintf(stderr, "rank %d: send/recv: %s\n", rank, loomGetLastError(NULL));
        goto out;
    }
    /* Not the last call: over shm a receiver that destroys its communicator right after its
     * last receive can fail the sender with "connection closed" (seen with many small
     * messages; a known race of its own). */
    r = loomAllReduce(a, b, 1, loomFloat, loomSum, comm, NULL);
    if (r != loomSuccess) {
        fprintf(stderr, "rank %d: closing allreduce: %s\n", rank, loomGetLastError(NULL));
        goto out;
    }
    rc = 0;
out:
    free(a);
    free(b);
    return rc;
}

START_TEST(test_max_message_tiny)
{
    set_param("LOOM_MAX_MESSAGE", "1");
    capture_start();
    uint64_t m = param_size(PARAM_MAX_MESSAGE);
    const char *log = capture_end();
    ck_assert_msg(m >= 4096, "LOOM_MAX_MESSAGE=1 gave %llu", (unsigned long long)m);
    LINE_HAS(log, "WARN", "LOOM_MAX_MESSAGE", "'1'", "using");
    for (int t = 0; t < 2; t++) {
        setenv("LOOM_TRANSPORT", t ? "shm" : "tcp", 1);
        param_reset_cache();
        ck_assert_int_eq(h_run_threads(2, bigmsg_rank, NULL), 0);
    }
}
END_TEST

START_TEST(test_debug_names)
{
    set_param("LOOM_DEBUG", "bogus");
    capture_start();
    int l = log_level();
    const char *log = capture_end();
    ck_assert_int_eq(l, LOG_WARN);
    LINE_HAS(log, "WARN", "LOOM_DEBUG", "'bogus'", "NONE", "TRACE", "default WARN");
    set_param("LOOM_DEBUG", "info");
    ck_assert_int_eq(log_level(), LOG_INFO);
    set_param("LOOM_DEBUG", "Trace");
    ck_assert_int_eq(log_level(), LOG_TRACE);
    set_param("LOOM_DEBUG", "none");
    ck_assert_int_eq(log_level(), LOG_NONE);
    set_param("LOOM_DEBUG", NULL);
    set_param("LOOM_DEBUG_SUBSYS", "init,bogus");
    capture_start();
    l = log_level();
    log = capture_end();
    LINE_HAS(log, "WARN", "LOOM_DEBUG_SUBSYS", "'init,bogus'", "TUNING");
}
END_TEST

/* Names are matched in any case and handed on in the table's spelling. */
START_TEST(test_names_any_case)
{
    set_param("LOOM_ALGO", "RING");
    ck_assert_str_eq(param_str(PARAM_ALGO), "ring");
    set_param("LOOM_TRANSPORT", "TCP");
    ck_assert_str_eq(param_str(PARAM_TRANSPORT), "tcp");
}
END_TEST

/* Variable names too: loom_nchannels is LOOM_NCHANNELS, said at WARN; the exact name wins over
 * a differently cased one. LOOM_SHM_CMA is in the table (it used to be read around it). */
START_TEST(test_variable_names_any_case)
{
    set_param("LOOM_NCHANNELS", NULL);
    set_param("loom_NChannels", "5");
    capture_start();
    int64_t n = param_int(PARAM_NCHANNELS);
    const char *log = capture_end();
    ck_assert_int_eq(n, 5);
    ck_assert(param_is_set(PARAM_NCHANNELS));
    LINE_HAS(log, "WARN", "loom_NChannels read as LOOM_NCHANNELS", "case-insensitive");
    set_param("LOOM_NCHANNELS", "3");
    ck_assert_int_eq(param_int(PARAM_NCHANNELS), 3);
    set_param("loom_NChannels", NULL);
    set_param("LOOM_NCHANNELS", NULL);
    ck_assert(!param_is_set(PARAM_NCHANNELS));
    set_param("LOOM_SHM_CMA", "bogus");
    capture_start();
    n = param_int(PARAM_SHM_CMA);
    log = capture_end();
    ck_assert_int_eq(n, 1);
    LINE_HAS(log, "WARN", "LOOM_SHM_CMA");
    set_param("LOOM_SHM_CMA", NULL);
}
END_TEST

/* The table itself: every default is accepted by its own range (a default outside it would
 * be replaced, with a warning, on every read). */
START_TEST(test_table_defaults_in_range)
{
    for (int i = 0; i < PARAM_COUNT; i++) {
        const param_desc_t *d = param_desc((param_id_t)i);
        char env[64];
        snprintf(env, sizeof(env), "LOOM_%s", d->name);
        if (d->type == PARAM_T_STR) {
            ck_assert_msg(d->names != NULL || d->bad == PARAM_BAD_DEFAULT, "%s", env);
            if (d->def[0] == '\0' || d->names == NULL) continue;
        } else {
            ck_assert_msg(d->min <= d->max, "%s: min %g > max %g", env, d->min, d->max);
        }
        set_param(env, d->def);
        capture_start();
        (void)param_text((param_id_t)i);
        const char *log = capture_end();
        ck_assert_msg(strstr(log, "WARN") == NULL, "%s's default '%s' is refused: %s", env, d->def,
                      log);
        set_param(env, NULL);
    }
}
END_TEST

/* Ranks logging into one file (mpirun's stderr, a test's log) never split each other's lines:
 * 4 processes each write 300 long WARN lines to the same open file at once, their stderr
 * buffered in 100-byte pieces (as a program may set it, and as the GPU machine's runs showed
 * stdio splitting a line): each line must come out whole. */
START_TEST(test_log_lines_whole)
{
    enum { NPROC = 4, NLINE = 300, LEN = 1200 };
    FILE *f = tmpfile();
    ck_assert_ptr_nonnull(f);
    fflush(stderr);
    int saved = dup(STDERR_FILENO);
    ck_assert_int_ge(saved, 0);
    ck_assert_int_ge(dup2(fileno(f), STDERR_FILENO), 0);
    pid_t pids[NPROC];
    for (int p = 0; p < NPROC; p++) {
        pids[p] = fork();
        if (pids[p] == 0) {
            static char sbuf[100];
            setvbuf(stderr, sbuf, _IOFBF, sizeof(sbuf));
            char body[LEN + 1];
            memset(body, 'a' + p, LEN);
            body[LEN] = 0;
            for (int i = 0; i < NLINE; i++)
                WARN(LOG_INIT, "<%d %s %d>", p, body, p);
            _exit(0);
        }
    }
    for (int p = 0; p < NPROC; p++) {
        int st = 0;
        waitpid(pids[p], &st, 0);
        ck_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    }
    dup2(saved, STDERR_FILENO);
    close(saved);
    rewind(f);
    static char line[4 * LEN];
    int count[NPROC] = {0}, bad = 0;
    while (fgets(line, sizeof(line), f)) {
        char *lt = strchr(line, '<');
        int p = lt && lt[1] >= '0' && lt[1] < '0' + NPROC ? lt[1] - '0' : -1;
        char want[16];
        snprintf(want, sizeof(want), " %d>\n", p);
        size_t n = strlen(line);
        bool whole = p >= 0 && n > LEN + 8 && !strcmp(line + n - strlen(want), want) &&
                     strspn(lt + 3, (char[]){(char)('a' + p), 0}) == LEN;
        if (whole)
            count[p]++;
        else
            bad++;
    }
    fclose(f);
    ck_assert_msg(bad == 0, "%d log lines were split or mixed", bad);
    for (int p = 0; p < NPROC; p++)
        ck_assert_msg(count[p] == NLINE, "process %d: %d of %d lines whole", p, count[p], NLINE);
}
END_TEST

static Suite *param_suite(void)
{
    Suite *s = suite_create("param");
    const h_case_t tests[] = {
        {.name = "timeout_negative", .test = test_timeout_negative},
        {.name = "timeout_nan", .test = test_timeout_nan},
        {.name = "timeout_inf", .test = test_timeout_inf},
        {.name = "handshake_zero", .test = test_handshake_zero},
        {.name = "nchannels_clamped", .test = test_nchannels_clamped},
        {.name = "max_message_tiny", .test = test_max_message_tiny},
        {.name = "debug_names", .test = test_debug_names},
        {.name = "names_any_case", .test = test_names_any_case},
        {.name = "variable_names_any_case", .test = test_variable_names_any_case},
        {.name = "table_defaults", .test = test_table_defaults_in_range},
        {.name = "log_lines_whole", .test = test_log_lines_whole},
    };
    h_add_cases(s, tests, sizeof(tests) / sizeof(tests[0]), 60);
    return s;
}

int main(void)
{
    setenv("LOOM_SOCKET_IFNAME", "lo", 1);
    setenv("LOOM_TIMEOUT", "10", 1);
    return h_check_main(param_suite(), false, CK_NORMAL);
}
