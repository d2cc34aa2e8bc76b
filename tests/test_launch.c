/*
 * Launch tests: the detection of every launcher's variables (launch_detect reading a table, so no
 * test depends on the environment it runs in), its precedence, malformed and incomplete
 * environments, launchers that disagree, the rendezvous it picks, and whole jobs initialised from
 * the environment in forked processes. Slurm is tested by its variables alone: srun is not
 * installed here. The mpirun runs are tests/launch_mpirun.sh.
 */
#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base.h"
#include "harness.h"
#include "launch.h"
#include "loom.h"

#define MAXV 24

typedef struct {
    const char *kv[MAXV][2];
} tenv_t;

static const char *tenv_get(void *arg, const char *name)
{
    const tenv_t *t = arg;
    for (int i = 0; i < MAXV && t->kv[i][0]; i++)
        if (!strcmp(t->kv[i][0], name)) return t->kv[i][1];
    return NULL;
}

/* What a PMIx server (Open MPI's mpirun) exports beside OMPI_COMM_WORLD_*. */
#define PMIX_VARS(r)                                                                               \
    {"PMIX_RANK", r}, {"PMIX_NAMESPACE", "1234"},                                                  \
    {                                                                                              \
        "PMIX_SERVER_URI41", "x"                                                                   \
    }

static launch_env_t detect_ok(const tenv_t *t)
{
    launch_env_t e;
    loomResult_t r = launch_detect(tenv_get, (void *)t, &e);
    ck_assert_msg(r == loomSuccess, "launch_detect: %s", base_last_error());
    return e;
}

/* The error text, asserted to name every string in want (NULL-terminated). */
static void detect_fails(const tenv_t *t, const char *const *want)
{
    launch_env_t e;
    base_clear_error();
    loomResult_t r = launch_detect(tenv_get, (void *)t, &e);
    ck_assert_msg(r != loomSuccess, "launch_detect accepted an environment it should refuse");
    const char *err = base_last_error();
    for (int i = 0; want[i]; i++)
        ck_assert_msg(strstr(err, want[i]), "error \"%s\" does not name \"%s\"", err, want[i]);
}

#define FAILS(env, ...)                                                                            \
    do {                                                                                           \
        tenv_t t_ = {env};                                                                         \
        const char *w_[] = {__VA_ARGS__, NULL};                                                    \
        detect_fails(&t_, w_);                                                                     \
    } while (0)
#define E(...)                                                                                     \
    {                                                                                              \
        __VA_ARGS__                                                                                \
    }

START_TEST(none)
{
    tenv_t t = {{{"HOME", "/root"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29500"}}};
    launch_env_t e = detect_ok(&t);
    ck_assert(!e.found);
}
END_TEST

START_TEST(each_launcher)
{
    static const struct {
        tenv_t t;
        const char *name;
        int rank, nranks, local;
    } cases[] = {
        {{{{"LOOM_RANK", "2"}, {"LOOM_WORLD_SIZE", "3"}, {"LOOM_ID_FILE", "/tmp/id"}}},
         "loom",
         2,
         3,
         -1},
        {{{{"RANK", "5"},
           {"WORLD_SIZE", "8"},
           {"LOCAL_RANK", "1"},
           {"MASTER_ADDR", "h"},
           {"MASTER_PORT", "29500"}}},
         "torchrun",
         5,
         8,
         1},
        {{{{"OMPI_COMM_WORLD_RANK", "3"},
           {"OMPI_COMM_WORLD_SIZE", "4"},
           {"OMPI_COMM_WORLD_LOCAL_RANK", "3"},
           {"MASTER_ADDR", "h"},
           {"MASTER_PORT", "1"}}},
         "Open MPI",
         3,
         4,
         3},
        {{{PMIX_VARS("7"), {"MASTER_ADDR", "h"}, {"MASTER_PORT", "2"}}}, "PMIx", 7, -1, -1},
        {{{{"PMI_RANK", "1"},
           {"PMI_SIZE", "2"},
           {"MPI_LOCALRANKID", "0"},
           {"MASTER_ADDR", "h"},
           {"MASTER_PORT", "2"}}},
         "MPICH/Hydra",
         1,
         2,
         0},
        {{{{"SLURM_PROCID", "6"},
           {"SLURM_NTASKS", "7"},
           {"SLURM_LOCALID", "2"},
           {"SLURM_JOB_ID", "99"},
           {"MASTER_ADDR", "h"},
           {"MASTER_PORT", "2"}}},
         "Slurm",
         6,
         7,
         2},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        launch_env_t e = detect_ok(&cases[i].t);
        ck_assert(e.found);
        ck_assert_str_eq(e.name, cases[i].name);
        ck_assert_int_eq(e.rank, cases[i].rank);
        ck_assert_int_eq(e.nranks, cases[i].nranks);
        ck_assert_int_eq(e.local_rank, cases[i].local);
    }
}
END_TEST

START_TEST(precedence)
{
    /* loom's own override everything, unchecked */
    tenv_t a = {{{"LOOM_RANK", "0"},
                 {"LOOM_WORLD_SIZE", "1"},
                 {"RANK", "3"},
                 {"WORLD_SIZE", "4"},
                 {"OMPI_COMM_WORLD_RANK", "2"},
                 {"OMPI_COMM_WORLD_SIZE", "4"}}};
    launch_env_t e = detect_ok(&a);
    ck_assert_str_eq(e.name, "loom");
    ck_assert_int_eq(e.nranks, 1);
    ck_assert_int_eq(e.meet, LAUNCH_MEET_ALONE);
    /* torchrun under srun: the inner launcher wins, the outer job is another size */
    tenv_t b = {{{"RANK", "5"},
                 {"WORLD_SIZE", "16"},
                 {"MASTER_ADDR", "h"},
                 {"MASTER_PORT", "9"},
                 {"SLURM_PROCID", "1"},
                 {"SLURM_NTASKS", "2"},
                 {"SLURM_STEP_ID", "0"}}};
    e = detect_ok(&b);
    ck_assert_str_eq(e.name, "torchrun");
    ck_assert_int_eq(e.rank, 5);
    ck_assert_int_eq(e.meet, LAUNCH_MEET_MASTER);
    /* mpirun sets PMIX_RANK beside its own: Open MPI gives the size, PMIx the rendezvous */
    tenv_t c = {{{"OMPI_COMM_WORLD_RANK", "1"},
                 {"OMPI_COMM_WORLD_SIZE", "4"},
                 PMIX_VARS("1"),
                 {"MASTER_ADDR", "h"},
                 {"MASTER_PORT", "9"}}};
    e = detect_ok(&c);
    ck_assert_str_eq(e.name, "Open MPI");
    ck_assert_int_eq(e.nranks, 4);
#ifdef LOOM_HAVE_PMIX
    ck_assert_int_eq(e.meet, LAUNCH_MEET_PMIX);
#elif defined(LOOM_HAVE_MPI)
    ck_assert_int_eq(e.meet, LAUNCH_MEET_MPI); /* loom starts MPI, which finds the server */
#else
    ck_assert_int_eq(e.meet, LAUNCH_MEET_MASTER);
#endif
    /* MPICH's Hydra: loom speaks PMI-1 to its server, at PMI_PORT or over PMI_FD, with or
     * without MPI in the build */
    tenv_t h = {{{"PMI_RANK", "1"}, {"PMI_SIZE", "3"}, {"PMI_PORT", "host:1234"}}};
    e = detect_ok(&h);
    ck_assert_str_eq(e.name, "MPICH/Hydra");
    ck_assert_int_eq(e.meet, LAUNCH_MEET_PMI1);
    tenv_t hf = {{{"PMI_RANK", "0"}, {"PMI_SIZE", "2"}, {"PMI_FD", "6"}}};
    ck_assert_int_eq(detect_ok(&hf).meet, LAUNCH_MEET_PMI1);
    /* mpirun inside a batch script: the script's own SLURM_PROCID=0 (no job step) is ignored */
    tenv_t d = {{{"OMPI_COMM_WORLD_RANK", "3"},
                 {"OMPI_COMM_WORLD_SIZE", "8"},
                 PMIX_VARS("3"),
                 {"SLURM_PROCID", "0"},
                 {"SLURM_NTASKS", "8"},
                 {"SLURM_JOB_ID", "7"},
                 {"MASTER_ADDR", "h"},
                 {"MASTER_PORT", "9"}}};
    e = detect_ok(&d);
    ck_assert_str_eq(e.name, "Open MPI");
    ck_assert_int_eq(e.rank, 3);
    /* srun --mpi=pmix: PMIx beside Slurm, agreeing */
    tenv_t f = {{{"SLURM_PROCID", "2"},
                 {"SLURM_NTASKS", "4"},
                 {"SLURM_STEP_ID", "0"},
                 PMIX_VARS("2"),
                 {"MASTER_ADDR", "h"},
                 {"MASTER_PORT", "9"}}};
    e = detect_ok(&f);
    ck_assert_str_eq(e.name, "PMIx");
    ck_assert_int_eq(e.rank, 2);
    /* Hydra before Slurm */
    tenv_t g = {{{"PMI_RANK", "1"},
                 {"PMI_SIZE", "3"},
                 {"SLURM_PROCID", "0"},
                 {"SLURM_NTASKS", "1"},
                 {"MASTER_ADDR", "h"},
                 {"MASTER_PORT", "9"}}};
    e = detect_ok(&g);
    ck_assert_str_eq(e.name, "MPICH/Hydra");
    ck_assert_int_eq(e.nranks, 3);
}
END_TEST

START_TEST(malformed)
{
    FAILS(E({"RANK", "abc"}, {"WORLD_SIZE", "2"}), "RANK=abc", "not a rank");
    FAILS(E({"RANK", "-1"}, {"WORLD_SIZE", "2"}), "RANK=-1");
    FAILS(E({"RANK", "1x"}, {"WORLD_SIZE", "2"}), "RANK=1x");
    FAILS(E({"RANK", "99999999999"}, {"WORLD_SIZE", "2"}), "RANK=99999999999");
    FAILS(E({"RANK", "0"}, {"WORLD_SIZE", "0"}), "WORLD_SIZE=0", "not a job size");
    FAILS(E({"RANK", "0"}, {"WORLD_SIZE", "two"}), "WORLD_SIZE=two");
    FAILS(E({"RANK", "4"}, {"WORLD_SIZE", "4"}), "RANK=4", "not below", "WORLD_SIZE=4");
    FAILS(E({"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "x"}), "LOCAL_RANK=x");
    FAILS(E({"LOOM_RANK", "a"}, {"LOOM_WORLD_SIZE", "2"}), "LOOM_RANK=a");
    FAILS(E({"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "-4"}),
          "OMPI_COMM_WORLD_SIZE=-4");
    FAILS(E({"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"},
            {"OMPI_COMM_WORLD_LOCAL_RANK", "z"}),
          "OMPI_COMM_WORLD_LOCAL_RANK=z");
    FAILS(E({"PMIX_RANK", "r0"}, {"PMIX_NAMESPACE", "n"}), "PMIX_RANK=r0");
    FAILS(E({"PMI_RANK", "2"}, {"PMI_SIZE", "2"}), "PMI_RANK=2", "PMI_SIZE=2");
    FAILS(E({"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "0"}), "SLURM_NTASKS=0");
    FAILS(E({"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}, {"SLURM_LOCALID", "-2"}),
          "SLURM_LOCALID=-2");
    FAILS(E({"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "0"}),
          "MASTER_PORT=0", "not a port");
    FAILS(E({"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "70000"}),
          "MASTER_PORT=70000");
}
END_TEST

START_TEST(incomplete)
{
    FAILS(E({"LOOM_RANK", "1"}), "LOOM_RANK=1", "LOOM_WORLD_SIZE");
    FAILS(E({"LOOM_RANK", "1"}, {"LOOM_WORLD_SIZE", "2"}), "rank 1 of 2",
          "LOOM_RANK/LOOM_WORLD_SIZE", "no MASTER_ADDR/MASTER_PORT");
    FAILS(E({"WORLD_SIZE", "4"}), "WORLD_SIZE=4", "RANK");
    FAILS(E({"OMPI_COMM_WORLD_RANK", "1"}), "OMPI_COMM_WORLD_RANK=1", "OMPI_COMM_WORLD_SIZE");
    FAILS(E({"PMI_SIZE", "3"}), "PMI_SIZE=3", "PMI_RANK");
    FAILS(E({"SLURM_PROCID", "3"}), "SLURM_PROCID=3", "SLURM_NTASKS");
    FAILS(E({"PMIX_NAMESPACE", "n"}), "PMIX_NAMESPACE=n", "PMIX_RANK");
    FAILS(E({"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}), "MASTER_ADDR=h",
          "MASTER_PORT");
    FAILS(E({"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "5"}), "MASTER_PORT=5",
          "MASTER_ADDR");
    /* a launcher of several ranks and no way to meet */
    FAILS(E({"RANK", "1"}, {"WORLD_SIZE", "2"}), "rank 1 of 2", "RANK/WORLD_SIZE", "MASTER_ADDR",
          "MASTER_PORT");
    FAILS(E({"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "8"}, {"SLURM_JOB_ID", "1"}),
          "rank 3 of 8 found by SLURM_PROCID/SLURM_NTASKS, but no way to meet the other ranks: no "
          "PMIx server (PMIX_SERVER_URI* unset) and no MASTER_ADDR/MASTER_PORT");
    FAILS(E({"PMI_RANK", "0"}, {"PMI_SIZE", "2"}), "rank 0 of 2 found by PMI_RANK/PMI_SIZE",
          "no PMIx server", "MASTER_ADDR/MASTER_PORT");
    FAILS(E({"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}, {"PMIX_RANK", "0"},
            {"PMIX_NAMESPACE", "n"}),
          "OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE", "PMIX_SERVER_URI* unset");
    /* torchrun's ranks meet at MASTER_ADDR even with a PMIx server about */
    FAILS(E({"RANK", "1"}, {"WORLD_SIZE", "2"}, PMIX_VARS("1")), "RANK/WORLD_SIZE",
          "MASTER_ADDR and MASTER_PORT are unset");
#if !defined(LOOM_HAVE_PMIX) && !defined(LOOM_HAVE_MPI)
    FAILS(E({"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}, PMIX_VARS("0")),
          "this build of loom has no PMIx");
#elif !defined(LOOM_HAVE_PMIX)
    /* no PMIx in loom, but MPI: loom starts MPI, whose MPI_Init reaches the PMIx server */
    tenv_t m = {{{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}, PMIX_VARS("0")}};
    ck_assert_int_eq(detect_ok(&m).meet, LAUNCH_MEET_MPI);
#endif
}
END_TEST

START_TEST(one_rank_alone)
{
    /* one rank needs no rendezvous: mpirun -np 1, or a plain batch script's own step */
    tenv_t a = {{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}}};
    launch_env_t e = detect_ok(&a);
    ck_assert_int_eq(e.meet, LAUNCH_MEET_ALONE);
    tenv_t b = {{{"RANK", "0"}, {"WORLD_SIZE", "1"}}};
    e = detect_ok(&b);
    ck_assert_int_eq(e.meet, LAUNCH_MEET_ALONE);
}
END_TEST

START_TEST(disagree)
{
    FAILS(E({"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "4"}, {"SLURM_PROCID", "2"},
            {"SLURM_NTASKS", "4"}, {"SLURM_STEP_ID", "0"}),
          "disagree", "Open MPI", "rank 1 of 4", "OMPI_COMM_WORLD_RANK", "Slurm", "rank 2 of 4",
          "SLURM_PROCID");
    FAILS(E({"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "4"}, PMIX_VARS("3")),
          "disagree", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "rank 3");
    FAILS(E({"RANK", "0"}, {"WORLD_SIZE", "2"}, {"PMI_RANK", "1"}, {"PMI_SIZE", "2"},
            {"MASTER_ADDR", "h"}, {"MASTER_PORT", "9"}),
          "disagree", "torchrun", "MPICH/Hydra", "PMI_RANK");
}
END_TEST

/* Whole jobs from the process environment: each rank is a forked child with its launcher's
 * variables; the sum of (rank+1) over ranks must come back exactly. */
static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t n = sizeof(a);
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, n) || getsockname(fd, (struct sockaddr *)&a, &n))
        return -1;
    close(fd);
    return ntohs(a.sin_port);
}

static int env_rank_main(int nranks)
{
    loomComm_t comm;
    loomResult_t r = loomCommInitFromEnv(&comm, NULL);
    if (r != loomSuccess) {
        fprintf(stderr, "loomCommInitFromEnv: %s\n", loomGetLastError(NULL));
        return 1;
    }
    int rank, n;
    loomCommUserRank(comm, &rank);
    loomCommCount(comm, &n);
    double v[3] = {rank + 1, 2.0 * rank, 1};
    r = loomAllReduce(v, v, 3, loomDouble, loomSum, comm, NULL);
    int bad = r != loomSuccess || n != nranks || v[0] != n * (n + 1) / 2.0 ||
              v[1] != (double)n * (n - 1) || v[2] != n;
    if (bad) fprintf(stderr, "rank %d: r=%d n=%d v=%g %g %g\n", rank, r, n, v[0], v[1], v[2]);
    loomCommDestroy(comm);
    return bad;
}

/* Runs nranks processes launched through rank_var/size_var, all with LOOM_JOB_SECRET "launch
 * test" except the last, which gets last_secret (NULL: the same); returns how many failed. */
static int run_env_job_secret(int nranks, const char *rank_var, const char *size_var,
                              const char *last_secret)
{
    int port = free_port();
    ck_assert_int_gt(port, 0);
    char ps[16];
    snprintf(ps, sizeof(ps), "%d", port);
    pid_t pids[8];
    for (int r = 0; r < nranks; r++) {
        pids[r] = fork();
        ck_assert_int_ge(pids[r], 0);
        if (pids[r] == 0) {
            char rs[16], ns[16];
            snprintf(rs, sizeof(rs), "%d", r);
            snprintf(ns, sizeof(ns), "%d", nranks);
            alarm(60);
            setenv(rank_var, rs, 1);
            setenv(size_var, ns, 1);
            setenv("MASTER_ADDR", "127.0.0.1", 1);
            setenv("MASTER_PORT", ps, 1);
            setenv("LOOM_JOB_SECRET", "launch test", 1);
            if (last_secret && r == nranks - 1) {
                setenv("LOOM_JOB_SECRET", last_secret, 1);
            }
            /* Ranks that cannot meet give up soon rather than at the default timeout. */
            if (last_secret) setenv("LOOM_TIMEOUT", "5", 1);
            _exit(env_rank_main(nranks));
        }
    }
    int failed = 0;
    for (int r = 0; r < nranks; r++) {
        int st;
        if (waitpid(pids[r], &st, 0) != pids[r] || !WIFEXITED(st) || WEXITSTATUS(st) != 0) failed++;
    }
    return failed;
}

static void run_env_job(int nranks, const char *rank_var, const char *size_var)
{
    ck_assert_int_eq(run_env_job_secret(nranks, rank_var, size_var, NULL), 0);
}

static void clear_launch_env(void)
{
    static const char *vars[] = {"LOOM_RANK",
                                 "LOOM_WORLD_SIZE",
                                 "RANK",
                                 "WORLD_SIZE",
                                 "LOCAL_RANK",
                                 "MASTER_ADDR",
                                 "MASTER_PORT",
                                 "OMPI_COMM_WORLD_RANK",
                                 "OMPI_COMM_WORLD_SIZE",
                                 "OMPI_COMM_WORLD_LOCAL_RANK",
                                 "PMIX_RANK",
                                 "PMIX_NAMESPACE",
                                 "PMI_RANK",
                                 "PMI_SIZE",
                                 "SLURM_PROCID",
                                 "SLURM_NTASKS",
                                 "SLURM_LOCALID",
                                 "SLURM_STEP_ID",
                                 "SLURM_STEPID"};
    for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++)
        unsetenv(vars[i]);
}

START_TEST(job_torchrun)
{
    clear_launch_env();
    run_env_job(3, "RANK", "WORLD_SIZE");
}
END_TEST

START_TEST(job_slurm_master)
{
    /* srun without PMIx, with MASTER_ADDR/MASTER_PORT exported by the batch script */
    clear_launch_env();
    run_env_job(2, "SLURM_PROCID", "SLURM_NTASKS");
}
END_TEST

START_TEST(job_other_secret)
{
    /* A rank whose LOOM_JOB_SECRET differs by one character derives another key: the rendezvous
     * refuses it, so neither it nor the rank waiting for it forms a communicator. */
    clear_launch_env();
    ck_assert_int_eq(run_env_job_secret(2, "RANK", "WORLD_SIZE", "launch tesu"), 2);
}
END_TEST

START_TEST(job_errors)
{
    clear_launch_env();
    loomComm_t comm;
    ck_assert_int_eq(loomCommInitFromEnv(&comm, NULL), loomInvalidUsage);
    ck_assert_ptr_nonnull(strstr(loomGetLastError(NULL), "found no launcher"));
    setenv("SLURM_PROCID", "3", 1);
    setenv("SLURM_NTASKS", "8", 1);
    ck_assert_int_eq(loomCommInitFromEnv(&comm, NULL), loomInvalidUsage);
    ck_assert_ptr_nonnull(strstr(loomGetLastError(NULL), "rank 3 of 8 found by SLURM_PROCID"));
    setenv("SLURM_NTASKS", "1", 1);
    ck_assert_int_eq(loomCommInitFromEnv(&comm, NULL), loomInvalidUsage);
    ck_assert_ptr_nonnull(strstr(loomGetLastError(NULL), "SLURM_PROCID=3"));
    setenv("SLURM_PROCID", "0", 1);
    ck_assert_int_eq(loomCommInitFromEnv(&comm, NULL), loomSuccess);
    int n = 0;
    loomCommCount(comm, &n);
    ck_assert_int_eq(n, 1);
    loomCommDestroy(comm);
}
END_TEST

/* ---- the PMI-1 client after a failed open (src/core/pmi1.c) ---- */

/* A PMI-1 server of one connection at a time, on a thread, that refuses the first init and
 * serves the second rendezvous in full (as Hydra would rank 1 of 2), recording what it was sent
 * and any line that breaks the protocol: the second attempt must start over (introduction, init)
 * on a new connection (PMI_PORT; the refused one closed) or on the launcher's descriptor again
 * (PMI_FD; left open), never carry on where the refused one stopped. */
typedef struct {
    int lfd;       /* PMI_PORT: the listening socket; -1 for PMI_FD */
    int fd;        /* PMI_FD: the server's end of the socket pair */
    char got[512]; /* the commands, as "initack init | initack init get_maxes ..." */
    char bad[512]; /* the first violation, if any */
    unsigned char id[sizeof(loomUniqueId)];
} pmi1_srv_t;

/* One line (without its newline) within 10 s; false at EOF, an error or the deadline. */
static bool srv_line(int fd, char *buf, size_t cap)
{
    size_t n = 0;
    double end = h_now_s() + 10;
    while (n + 1 < cap) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (h_now_s() > end || poll(&p, 1, 100) < 0) return false;
        if (!(p.revents & (POLLIN | POLLHUP | POLLERR))) continue;
        char ch;
        if (read(fd, &ch, 1) != 1) return false;
        if (ch == '\n') break;
        buf[n++] = ch;
    }
    buf[n] = '\0';
    return true;
}

static void srv_say(int fd, const char *s)
{
    ck_assert_int_eq(write(fd, s, strlen(s)), (ssize_t)strlen(s));
}

/* Expects a line starting with `cmd=want` on fd; records it, or the violation. */
static bool srv_expect(pmi1_srv_t *v, int fd, const char *want)
{
    char line[1024], cmd[64];
    snprintf(cmd, sizeof(cmd), "cmd=%s", want);
    if (!srv_line(fd, line, sizeof(line))) {
        if (!v->bad[0]) snprintf(v->bad, sizeof(v->bad), "no %s (end of stream)", cmd);
        return false;
    }
    size_t l = strlen(cmd);
    if (strncmp(line, cmd, l) != 0 || (line[l] != ' ' && line[l] != '\0')) {
        if (!v->bad[0])
            snprintf(v->bad, sizeof(v->bad), "expected %s, got \"%.200s\" (after: %.200s)", cmd,
                     line, v->got);
        return false;
    }
    size_t g = strlen(v->got);
    snprintf(v->got + g, sizeof(v->got) - g, "%s%s", g ? " " : "", want);
    return true;
}

static void *pmi1_srv_main(void *arg)
{
    pmi1_srv_t *v = arg;
    for (int attempt = 0; attempt < 2; attempt++) {
        int fd = v->fd;
        if (v->lfd >= 0) {
            struct pollfd p = {.fd = v->lfd, .events = POLLIN};
            if (poll(&p, 1, 10000) != 1) {
                snprintf(v->bad, sizeof(v->bad), "no connection %d within 10 s (after: %.200s)",
                         attempt + 1, v->got);
                return NULL;
            }
            fd = accept(v->lfd, NULL, NULL);
            if (fd < 0) {
                snprintf(v->bad, sizeof(v->bad), "accept: %s", strerror(errno));
                return NULL;
            }
            if (!srv_expect(v, fd, "initack")) goto out;
            srv_say(fd, "cmd=initack\ncmd=set size=2\ncmd=set rank=1\ncmd=set debug=0\n");
        }
        if (!srv_expect(v, fd, "init")) goto out;
        if (attempt == 0) {
            srv_say(fd, "cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=-1 "
                        "msg=version_not_supported\n");
            size_t g = strlen(v->got);
            snprintf(v->got + g, sizeof(v->got) - g, " |");
            if (v->lfd >= 0) {
                /* the refused connection: loom closes it without another word */
                char line[256];
                if (srv_line(fd, line, sizeof(line)) && !v->bad[0])
                    snprintf(v->bad, sizeof(v->bad),
                             "the refused connection was used again: \"%.200s\"", line);
                close(fd);
                if (v->bad[0]) return NULL;
            }
            continue;
        }
        srv_say(fd, "cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0\n");
        if (!srv_expect(v, fd, "get_maxes")) goto out;
        srv_say(fd, "cmd=maxes kvsname_max=256 keylen_max=64 vallen_max=1024\n");
        if (!srv_expect(v, fd, "get_my_kvsname")) goto out;
        srv_say(fd, "cmd=my_kvsname kvsname=kvs_7_0 rc=0\n");
        if (!srv_expect(v, fd, "barrier_in")) goto out;
        srv_say(fd, "cmd=barrier_out\n");
        if (!srv_expect(v, fd, "get")) goto out;
        char val[2 * sizeof(v->id) + 1];
        for (size_t i = 0; i < sizeof(v->id); i++)
            snprintf(val + 2 * i, 3, "%02x", v->id[i]);
        char reply[sizeof(val) + 64];
        snprintf(reply, sizeof(reply), "cmd=get_result rc=0 value=%s\n", val);
        srv_say(fd, reply);
    out:
        if (v->lfd >= 0) close(fd);
        return NULL;
    }
    return NULL;
}

/* Two rendezvous through the server: the first fails naming the refusal, the second succeeds
 * with the server's id. */
static void pmi1_twice(pmi1_srv_t *v, int loom_fd)
{
    for (size_t i = 0; i < sizeof(v->id); i++)
        v->id[i] = (unsigned char)(i * 7 + 3);
    pthread_t t;
    ck_assert_int_eq(pthread_create(&t, NULL, pmi1_srv_main, v), 0);
    launch_env_t e = {.found = true,
                      .name = "MPICH/Hydra",
                      .vars = "PMI_RANK/PMI_SIZE",
                      .rank = 1,
                      .nranks = 2,
                      .local_rank = -1,
                      .meet = LAUNCH_MEET_PMI1};
    loomUniqueId id;
    int n = 0;
    base_clear_error();
    ck_assert_int_ne(launch_pmi1_meet(&e, &id, &n), loomSuccess);
    const char *err = base_last_error();
    ck_assert_msg(strstr(err, "answered cmd=init") && strstr(err, "version_not_supported"),
                  "first attempt: %s", err);
    if (loom_fd >= 0) ck_assert_msg(fcntl(loom_fd, F_GETFD) != -1, "PMI_FD closed by loom");
    memset(&id, 0, sizeof(id));
    loomResult_t r = launch_pmi1_meet(&e, &id, &n);
    const char *err2 = r == loomSuccess ? "" : base_last_error();
    pthread_join(t, NULL);
    ck_assert_msg(r == loomSuccess && !v->bad[0], "second attempt: %s (the server saw: %s; %s)",
                  r == loomSuccess ? "succeeded" : err2, v->got, v->bad[0] ? v->bad : "no error");
    ck_assert_int_eq(n, 2);
    ck_assert_int_eq(memcmp(&id, v->id, sizeof(id)), 0);
}

START_TEST(pmi1_port_after_refusal)
{
    clear_launch_env();
    pmi1_srv_t *v = calloc(1, sizeof(*v));
    v->fd = -1;
    v->lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof(a);
    ck_assert_int_eq(bind(v->lfd, (struct sockaddr *)&a, al), 0);
    ck_assert_int_eq(listen(v->lfd, 4), 0);
    ck_assert_int_eq(getsockname(v->lfd, (struct sockaddr *)&a, &al), 0);
    char port[64];
    snprintf(port, sizeof(port), "127.0.0.1:%d", ntohs(a.sin_port));
    setenv("PMI_PORT", port, 1);
    setenv("PMI_ID", "1", 1);
    pmi1_twice(v, -1);
    ck_assert_str_eq(v->got, "initack init | initack init get_maxes get_my_kvsname barrier_in get");
    close(v->lfd);
    free(v);
}
END_TEST

START_TEST(pmi1_fd_after_refusal)
{
    clear_launch_env();
    int sv[2];
    ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    pmi1_srv_t *v = calloc(1, sizeof(*v));
    v->lfd = -1;
    v->fd = sv[0];
    char fds[16];
    snprintf(fds, sizeof(fds), "%d", sv[1]);
    setenv("PMI_FD", fds, 1);
    pmi1_twice(v, sv[1]);
    ck_assert_str_eq(v->got, "init | init get_maxes get_my_kvsname barrier_in get");
    close(sv[0]);
    free(v);
}
END_TEST

static Suite *launch_suite(void)
{
    Suite *s = suite_create("launch");
    TCase *d = tcase_create("detect");
    tcase_add_test(d, none);
    tcase_add_test(d, each_launcher);
    tcase_add_test(d, precedence);
    tcase_add_test(d, malformed);
    tcase_add_test(d, incomplete);
    tcase_add_test(d, one_rank_alone);
    tcase_add_test(d, disagree);
    suite_add_tcase(s, d);
    TCase *j = tcase_create("jobs");
    tcase_set_timeout(j, 60);
    tcase_add_test(j, job_torchrun);
    tcase_add_test(j, job_slurm_master);
    tcase_add_test(j, job_errors);
    tcase_add_test(j, job_other_secret);
    suite_add_tcase(s, j);
    TCase *p = tcase_create("pmi1");
    tcase_set_timeout(p, 60);
    tcase_add_test(p, pmi1_port_after_refusal);
    tcase_add_test(p, pmi1_fd_after_refusal);
    suite_add_tcase(s, p);
    return s;
}

int main(void)
{
    setenv("LOOM_SOCKET_IFNAME", "lo", 1);
    setenv("LOOM_TIMEOUT", "10", 1);
    /* each test in its own process: the jobs set the process environment */
    return h_check_main(launch_suite(), true, CK_NORMAL);
}
