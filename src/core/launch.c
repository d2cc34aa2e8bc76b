/*
 * Launch from a launcher's environment: who started this process, as which rank of how many,
 * and how the ranks meet.
 *
 * Precedence (the first launcher found gives rank, size and local rank):
 *   1. loom's own    LOOM_RANK, LOOM_WORLD_SIZE            (an explicit override: never compared)
 *   2. torchrun      RANK, WORLD_SIZE, LOCAL_RANK
 *   3. Open MPI      OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK
 *   4. PMIx          PMIX_RANK (+ PMIX_NAMESPACE; the size is the PMIx server's job size)
 *   5. MPICH/Hydra   PMI_RANK, PMI_SIZE, MPI_LOCALRANKID (or, with -pmi-port, PMI_ID and
 *                    PMI_PORT; the size is the PMI-1 server's)
 *   6. Slurm         SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID
 * Innermost first: torchrun under srun and mpirun inside an allocation are common, and the inner
 * launcher is the one that started this process. Two launchers that report the same size describe
 * the same job, so different ranks there are an error naming both; a different size is an
 * enclosing job. Slurm's variables outside a job step (a batch script sets SLURM_PROCID=0 for
 * itself and every mpirun below it inherits that) are ignored when another launcher is present.
 *
 * Rendezvous: one rank needs none; LOOM_RANK's ranks with LOOM_ID_FILE meet through that file
 * (loom-perf writes and reads it); torchrun's ranks meet at MASTER_ADDR:MASTER_PORT; the others
 * over MPI_COMM_WORLD when the program already runs MPI (rank 0's unique id, and with it the
 * job's secret, is broadcast), else through the launcher's PMIx server when one is reachable (the
 * id travels through PMIx), else over MPI initialised by loom where loom has MPI but no PMIx and
 * MPI_Init can find the launcher (its PMIx server), else, under MPICH's Hydra (PMI_FD or
 * PMI_PORT), through its PMI-1 server, which loom speaks itself (pmi1.c), else at
 * MASTER_ADDR:MASTER_PORT. A launcher of more than one rank
 * without either is an error, never a silent one-rank job.
 */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm.h"
#include "fork.h"
#include "launch.h"
#include "param.h"

#ifdef LOOM_HAVE_PMIX
#include <pmix.h>
#endif

typedef struct {
    const char *name;
    const char *rank_var, *size_var, *local_var; /* size_var NULL: the PMIx server knows it */
    const char *vars;
} launch_src_t;

enum { SRC_LOOM, SRC_TORCHRUN, SRC_OMPI, SRC_PMIX, SRC_PMI, SRC_PMI_PORT, SRC_SLURM, SRC_COUNT };

static const launch_src_t launch_srcs[SRC_COUNT] = {
    [SRC_LOOM] = {"loom", "LOOM_RANK", "LOOM_WORLD_SIZE", NULL, "LOOM_RANK/LOOM_WORLD_SIZE"},
    [SRC_TORCHRUN] = {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "RANK/WORLD_SIZE"},
    [SRC_OMPI] = {"Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                  "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE"},
    [SRC_PMIX] = {"PMIx", "PMIX_RANK", NULL, NULL, "PMIX_RANK"},
    [SRC_PMI] = {"MPICH/Hydra", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "PMI_RANK/PMI_SIZE"},
    /* mpiexec.hydra -pmi-port: only the port and the process's id; the server gives the size */
    [SRC_PMI_PORT] = {"MPICH/Hydra", "PMI_ID", NULL, "MPI_LOCALRANKID", "PMI_PORT/PMI_ID"},
    [SRC_SLURM] = {"Slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID",
                   "SLURM_PROCID/SLURM_NTASKS"},
};

/* The names PMIx servers of versions 2 to 4 export their address under. */
static const char *const launch_pmix_uris[] = {"PMIX_SERVER_URI",   "PMIX_SERVER_URI2",
                                               "PMIX_SERVER_URI21", "PMIX_SERVER_URI3",
                                               "PMIX_SERVER_URI4",  "PMIX_SERVER_URI41"};

typedef struct {
    bool set;
    int rank, nranks, local_rank;
} launch_seen_t;

static const char *launch_get(launch_env_fn env, void *arg, const char *name)
{
    if (name == NULL) return NULL;
    const char *v = env(arg, name);
    return v && v[0] ? v : NULL;
}

static bool launch_parse_int(const char *v, int min, int *out)
{
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (end == v || *end != '\0' || errno != 0 || x < min || x > INT_MAX) return false;
    *out = (int)x;
    return true;
}

static loomResult_t launch_read_src(launch_env_fn env, void *arg, const launch_src_t *s,
                                    launch_seen_t *out)
{
    const char *rv = launch_get(env, arg, s->rank_var), *sv = launch_get(env, arg, s->size_var);
    const char *lv = launch_get(env, arg, s->local_var);
    out->set = false;
    if (rv == NULL && sv == NULL) return loomSuccess;
    if (s->size_var && (rv == NULL || sv == NULL))
        return base_error(loomInvalidUsage, LOG_BOOT, "%s=%s is set but %s is not; %s needs both",
                          rv ? s->rank_var : s->size_var, rv ? rv : sv,
                          rv ? s->size_var : s->rank_var, s->name);
    if (!launch_parse_int(rv, 0, &out->rank))
        return base_error(loomInvalidUsage, LOG_BOOT,
                          "%s=%s is not a rank (a whole number from 0) for %s", s->rank_var, rv,
                          s->name);
    out->nranks = -1;
    if (sv && !launch_parse_int(sv, 1, &out->nranks))
        return base_error(loomInvalidUsage, LOG_BOOT,
                          "%s=%s is not a job size (a whole number from 1) for %s", s->size_var, sv,
                          s->name);
    if (out->nranks > 0 && out->rank >= out->nranks)
        return base_error(loomInvalidUsage, LOG_BOOT, "%s=%d is not below %s=%d", s->rank_var,
                          out->rank, s->size_var, out->nranks);
    out->local_rank = -1;
    if (lv && !launch_parse_int(lv, 0, &out->local_rank))
        return base_error(loomInvalidUsage, LOG_BOOT,
                          "%s=%s is not a local rank (a whole number from 0) for %s", s->local_var,
                          lv, s->name);
    out->set = true;
    return loomSuccess;
}

static bool launch_have_pmix_server(launch_env_fn env, void *arg)
{
    if (!launch_get(env, arg, "PMIX_NAMESPACE") || !launch_get(env, arg, "PMIX_RANK")) return false;
    for (size_t i = 0; i < sizeof(launch_pmix_uris) / sizeof(launch_pmix_uris[0]); i++)
        if (launch_get(env, arg, launch_pmix_uris[i])) return true;
    return false;
}

#ifdef LOOM_HAVE_PMIX
#define LAUNCH_PMIX_BUILT 1
#else
#define LAUNCH_PMIX_BUILT 0
#endif
#ifdef LOOM_HAVE_MPI
#define LAUNCH_MPI_BUILT 1
#define LAUNCH_MPI_RUNNING() launch_mpi_running()
#else
#define LAUNCH_MPI_BUILT 0
#define LAUNCH_MPI_RUNNING() false
#endif

static loomResult_t launch_pick_meet(launch_env_fn env, void *arg, int src, launch_env_t *e)
{
    const char *ma = launch_get(env, arg, "MASTER_ADDR"), *mp = launch_get(env, arg, "MASTER_PORT");
    if ((ma == NULL) != (mp == NULL))
        return base_error(loomInvalidUsage, LOG_BOOT, "%s=%s is set but %s is not",
                          ma ? "MASTER_ADDR" : "MASTER_PORT", ma ? ma : mp,
                          ma ? "MASTER_PORT" : "MASTER_ADDR");
    int port;
    if (mp && (!launch_parse_int(mp, 1, &port) || port > 65535))
        return base_error(loomInvalidUsage, LOG_BOOT, "MASTER_PORT=%s is not a port (1 to 65535)",
                          mp);
    e->master_addr = ma;
    e->master_port = mp;
    bool pmix_env = launch_have_pmix_server(env, arg);
    if (e->nranks == 1) {
        e->meet = LAUNCH_MEET_ALONE;
        return loomSuccess;
    }
    if (src == SRC_LOOM && launch_get(env, arg, "LOOM_ID_FILE")) {
        e->meet = LAUNCH_MEET_ID_FILE;
        return loomSuccess;
    }
    /* A program already inside MPI meets over it, whatever else is there. */
    bool mpi_launcher = src == SRC_OMPI || src == SRC_PMIX || src == SRC_PMI || src == SRC_SLURM;
    if (mpi_launcher && LAUNCH_MPI_RUNNING()) {
        e->meet = LAUNCH_MEET_MPI;
        return loomSuccess;
    }
    if (src != SRC_TORCHRUN && pmix_env && LAUNCH_PMIX_BUILT) {
        e->meet = LAUNCH_MEET_PMIX;
        return loomSuccess;
    }
    /* MPICH's Hydra (and other PMI-1 launchers): loom speaks PMI-1 itself, over the descriptor
     * or port the launcher left; no MPI library is needed (an Open MPI one could not talk to
     * Hydra anyway). */
    if ((src == SRC_PMI || src == SRC_PMI_PORT) &&
        (launch_get(env, arg, "PMI_PORT") || launch_get(env, arg, "PMI_FD"))) {
        e->meet = LAUNCH_MEET_PMI1;
        return loomSuccess;
    }
    /* Without PMIx in loom, loom can start MPI itself where MPI_Init will find the launcher:
     * Open MPI's PMIx server. */
    bool mpi_can_start = (src == SRC_OMPI || src == SRC_PMIX) && pmix_env;
    if (LAUNCH_MPI_BUILT && mpi_can_start) {
        e->meet = LAUNCH_MEET_MPI;
        return loomSuccess;
    }
    if (ma) {
        e->meet = LAUNCH_MEET_MASTER;
        return loomSuccess;
    }
    char of[32] = "";
    if (e->nranks > 0) snprintf(of, sizeof(of), " of %d", e->nranks);
    if (src == SRC_TORCHRUN)
        return base_error(loomInvalidUsage, LOG_BOOT,
                          "rank %d%s found by RANK/WORLD_SIZE (torchrun's variables), but no way "
                          "to meet the other ranks: MASTER_ADDR and MASTER_PORT are unset; "
                          "torchrun exports them, or export them on every rank (rank 0's host "
                          "and a free port)",
                          e->rank, of);
    const char *pmix_why =
        pmix_env ? "a PMIx server (PMIX_SERVER_URI* set), but this build of loom has no PMIx "
                   "(built without libpmix-dev or with -Dpmix=disabled),"
                 : "no PMIx server (PMIX_SERVER_URI* unset)";
    return base_error(loomInvalidUsage, LOG_BOOT,
                      "rank %d%s found by %s, but no way to meet the other ranks: %s and no "
                      "MASTER_ADDR/MASTER_PORT; start the job with a launcher that runs a PMIx "
                      "server (Open MPI's mpirun, srun --mpi=pmix), or export MASTER_ADDR and "
                      "MASTER_PORT (rank 0's host and a free port) on every rank",
                      e->rank, of, e->vars, pmix_why);
}

loomResult_t launch_detect(launch_env_fn env, void *arg, launch_env_t *out)
{
    launch_seen_t seen[SRC_COUNT];
    int win = -1;
    bool slurm_step = launch_get(env, arg, "SLURM_STEP_ID") || launch_get(env, arg, "SLURM_STEPID");
    for (int i = 0; i < SRC_COUNT; i++) {
        if (i == SRC_SLURM && win >= 0 && !slurm_step) {
            seen[i].set = false;
            continue;
        }
        LOOM_CHECK(launch_read_src(env, arg, &launch_srcs[i], &seen[i]));
        if (i == SRC_PMIX && !seen[i].set && launch_get(env, arg, "PMIX_NAMESPACE"))
            return base_error(loomInvalidUsage, LOG_BOOT,
                              "PMIX_NAMESPACE=%s is set but PMIX_RANK is not (a PMIx server sets "
                              "both)",
                              launch_get(env, arg, "PMIX_NAMESPACE"));
        if (seen[i].set && win < 0) win = i;
    }
    launch_env_t e = {.found = false, .rank = 0, .nranks = 1, .local_rank = -1};
    if (win < 0) {
        *out = e;
        return loomSuccess;
    }
    const launch_seen_t *w = &seen[win];
    for (int i = win + 1; i < SRC_COUNT && win != SRC_LOOM; i++) {
        const launch_seen_t *o = &seen[i];
        if (!o->set || o->rank == w->rank) continue;
        /* PMIx alone gives no size: mpirun and srun --mpi=pmix set PMIX_RANK beside their own */
        bool same_job =
            o->nranks > 0 ? o->nranks == w->nranks : (win == SRC_OMPI || win == SRC_SLURM);
        if (!same_job) continue;
        char ws[16] = "?", os[16] = "?";
        if (w->nranks > 0) snprintf(ws, sizeof(ws), "%d", w->nranks);
        if (o->nranks > 0) snprintf(os, sizeof(os), "%d", o->nranks);
        return base_error(loomInvalidUsage, LOG_BOOT,
                          "launchers disagree: %s says rank %d of %s (%s) but %s says rank %d of "
                          "%s (%s); unset the stale variables",
                          launch_srcs[win].name, w->rank, ws, launch_srcs[win].vars,
                          launch_srcs[i].name, o->rank, os, launch_srcs[i].vars);
    }
    e.found = true;
    e.name = launch_srcs[win].name;
    e.vars = launch_srcs[win].vars;
    e.rank = w->rank;
    e.nranks = w->nranks;
    e.local_rank = w->local_rank;
    LOOM_CHECK(launch_pick_meet(env, arg, win, &e));
    *out = e;
    return loomSuccess;
}

static const char *launch_getenv(void *arg, const char *name)
{
    (void)arg;
    return getenv(name);
}

LOOM_EXPORT loomResult_t loom_launch_detect(launch_env_t *out)
{
    return launch_detect(launch_getenv, NULL, out);
}

#ifdef LOOM_HAVE_PMIX
/*
 * The PMIx client is the process's, like the launcher: PMIx_Init is reference counted, so an MPI
 * library in the same process (its MPI_Init calls PMIx_Init too) shares it. It stays up until the
 * process exits: finalizing right after the rendezvous would, in a program that calls MPI_Init
 * later, end the client and make MPI start a second one, which servers need not accept. The
 * generation counts the inits from the environment, which are collective and so happen in the
 * same order on every rank, so each publishes its id under its own key.
 */
static pthread_mutex_t launch_pmix_lock = PTHREAD_MUTEX_INITIALIZER;
static bool launch_pmix_up;
static pid_t launch_pmix_pid;
static pmix_proc_t launch_pmix_me;
static unsigned launch_pmix_gen;

/* Not taken before a fork: it is held across PMIx fences, which may wait for other processes.
 * The child cannot use its parent's PMIx connection anyway (launch_pmix_pid says whose it is),
 * so it only needs a lock that nobody holds. */
void launch_atfork(base_fork_phase_t phase)
{
    if (phase != BASE_FORK_CHILD) return;
    pthread_mutex_init(&launch_pmix_lock, NULL);
    pmi1_atfork_child();
}

__attribute__((destructor)) static void launch_pmix_fini(void)
{
    /* A forked child must not finalize its parent's client. */
    if (launch_pmix_up && launch_pmix_pid == getpid()) PMIx_Finalize(NULL, 0);
}

static loomResult_t launch_pmix_meet_locked(const launch_env_t *e, loomUniqueId *id, int *nranks)
{
    pmix_status_t rc;
    if (!launch_pmix_up) {
        rc = PMIx_Init(&launch_pmix_me, NULL, 0);
        if (rc != PMIX_SUCCESS)
            return base_error(loomSystemError, LOG_BOOT,
                              "PMIx_Init (PMIX_NAMESPACE=%s PMIX_RANK=%s): %s",
                              getenv("PMIX_NAMESPACE"), getenv("PMIX_RANK"), PMIx_Error_string(rc));
        launch_pmix_up = true;
        launch_pmix_pid = getpid();
    }
    const pmix_proc_t *me = &launch_pmix_me;
    pmix_proc_t all, root;
    PMIX_LOAD_PROCID(&all, me->nspace, PMIX_RANK_WILDCARD);
    PMIX_LOAD_PROCID(&root, me->nspace, 0);
    pmix_value_t *val = NULL;
    rc = PMIx_Get(&all, PMIX_JOB_SIZE, NULL, 0, &val);
    if (rc != PMIX_SUCCESS || val == NULL || val->type != PMIX_UINT32)
        return base_error(loomSystemError, LOG_BOOT, "PMIx_Get(PMIX_JOB_SIZE) of namespace %s: %s",
                          me->nspace, rc != PMIX_SUCCESS ? PMIx_Error_string(rc) : "not a uint32");
    uint32_t size = val->data.uint32;
    PMIX_VALUE_RELEASE(val);
    if (size < 1 || size > INT_MAX || (e->nranks > 0 && (uint32_t)e->nranks != size) ||
        me->rank != (pmix_rank_t)e->rank)
        return base_error(loomInvalidUsage, LOG_BOOT,
                          "launchers disagree: %s says rank %d of %d (%s) but the PMIx server says "
                          "rank %u of %u (namespace %s)",
                          e->name, e->rank, e->nranks, e->vars, (unsigned)me->rank, size,
                          me->nspace);
    char key[PMIX_MAX_KEYLEN + 1];
    snprintf(key, sizeof(key), "loom.uid.%u", launch_pmix_gen++);
    if (e->rank == 0) {
        LOOM_CHECK(boot_uid_create(id));
        pmix_value_t v;
        PMIX_VALUE_CONSTRUCT(&v);
        v.type = PMIX_BYTE_OBJECT;
        v.data.bo.bytes = (char *)id;
        v.data.bo.size = sizeof(*id);
        rc = PMIx_Put(PMIX_GLOBAL, key, &v);
        if (rc == PMIX_SUCCESS) rc = PMIx_Commit();
        if (rc != PMIX_SUCCESS)
            return base_error(loomSystemError, LOG_BOOT, "PMIx_Put/Commit of %s: %s", key,
                              PMIx_Error_string(rc));
    }
    /* A rank that never arrives must not hold the others for ever; the launcher kills the job
     * when one dies, the timeout covers one that is stuck. */
    double t = param_double(PARAM_TIMEOUT);
    int tmo = t > 0 ? (int)(t * 4 + 1) : 0;
    bool collect = true;
    pmix_info_t info[2];
    PMIX_INFO_CONSTRUCT(&info[0]);
    PMIX_INFO_CONSTRUCT(&info[1]);
    PMIX_INFO_LOAD(&info[0], PMIX_COLLECT_DATA, &collect, PMIX_BOOL);
    PMIX_INFO_LOAD(&info[1], PMIX_TIMEOUT, &tmo, PMIX_INT);
    rc = PMIx_Fence(&all, 1, info, tmo > 0 ? 2 : 1);
    PMIX_INFO_DESTRUCT(&info[0]);
    PMIX_INFO_DESTRUCT(&info[1]);
    if (rc != PMIX_SUCCESS)
        return base_error(loomSystemError, LOG_BOOT,
                          "rank %d: PMIx_Fence over the %u ranks of namespace %s: %s (every rank "
                          "must call the init from the environment, within %d s)",
                          e->rank, size, me->nspace, PMIx_Error_string(rc), tmo);
    if (e->rank != 0) {
        rc = PMIx_Get(&root, key, NULL, 0, &val);
        if (rc != PMIX_SUCCESS || val == NULL || val->type != PMIX_BYTE_OBJECT ||
            val->data.bo.size != sizeof(*id)) {
            if (rc == PMIX_SUCCESS) PMIX_VALUE_RELEASE(val);
            return base_error(loomSystemError, LOG_BOOT,
                              "rank %d: PMIx_Get of %s from rank 0 of namespace %s: %s", e->rank,
                              key, me->nspace,
                              rc != PMIX_SUCCESS ? PMIx_Error_string(rc) : "not a unique id");
        }
        memcpy(id, val->data.bo.bytes, sizeof(*id));
        PMIX_VALUE_RELEASE(val);
    }
    INFO(LOG_BOOT, "rank %d of %u met through PMIx (namespace %s, key %s)", e->rank, size,
         me->nspace, key);
    *nranks = (int)size;
    return loomSuccess;
}

static loomResult_t launch_pmix_meet(const launch_env_t *e, loomUniqueId *id, int *nranks)
{
    pthread_mutex_lock(&launch_pmix_lock);
    loomResult_t r = launch_pmix_meet_locked(e, id, nranks);
    pthread_mutex_unlock(&launch_pmix_lock);
    return r;
}
#else
/* Without PMIx only the PMI-1 client's lock is reset in a child (fork.c calls this in every
 * build). */
void launch_atfork(base_fork_phase_t phase)
{
    if (phase == BASE_FORK_CHILD) pmi1_atfork_child();
}
#endif

loomResult_t launch_uid_from_env(loomUniqueId *id, int *rank, int *nranks)
{
    launch_env_t e;
    LOOM_CHECK(launch_detect(launch_getenv, NULL, &e));
    if (!e.found)
        return base_error(loomInvalidUsage, LOG_BOOT,
                          "init from the environment found no launcher: none of LOOM_RANK, RANK "
                          "(torchrun), OMPI_COMM_WORLD_RANK, PMIX_RANK, PMI_RANK, SLURM_PROCID "
                          "is set; start the program under mpirun, srun or torchrun, or use "
                          "loomGetUniqueId and loomCommInitRank");
    INFO(LOG_BOOT, "launched by %s (%s): rank %d of %d", e.name, e.vars, e.rank, e.nranks);
    switch (e.meet) {
    case LAUNCH_MEET_ALONE: LOOM_CHECK(boot_uid_create(id)); break;
    case LAUNCH_MEET_MASTER:
        LOOM_CHECK(boot_uid_master(e.master_addr, e.master_port, e.rank, e.nranks, id));
        break;
    case LAUNCH_MEET_ID_FILE:
        return base_error(loomInvalidUsage, LOG_BOOT,
                          "LOOM_RANK=%d with LOOM_ID_FILE: the id file is loom-perf's way to meet; "
                          "loomCommInitFromEnv meets through a PMIx server or at "
                          "MASTER_ADDR:MASTER_PORT (unset LOOM_ID_FILE and export those)",
                          e.rank);
    case LAUNCH_MEET_MPI:
#ifdef LOOM_HAVE_MPI
        LOOM_CHECK(launch_mpi_meet(e.name, e.vars, e.rank, e.nranks, id, &e.nranks));
        break;
#else
        return base_error(loomInternalError, LOG_BOOT, "MPI chosen in a build without MPI");
#endif
    case LAUNCH_MEET_PMI1: LOOM_CHECK(launch_pmi1_meet(&e, id, &e.nranks)); break;
    case LAUNCH_MEET_PMIX:
#ifdef LOOM_HAVE_PMIX
        LOOM_CHECK(launch_pmix_meet(&e, id, &e.nranks));
        break;
#else
        return base_error(loomInternalError, LOG_BOOT, "PMIx chosen in a build without PMIx");
#endif
    }
    *rank = e.rank;
    *nranks = e.nranks;
    return loomSuccess;
}
