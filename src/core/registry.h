/*
 * The allreduce algorithm registry: one row per algorithm, with its name (LOOM_ALGO's value),
 * when automatic selection may take it, its cost under the alpha-beta model, and its schedule
 * generator. Selection, LOOM_ALGO parsing, the TUNING log, loom-info, the planner and the tests
 * all read this table; a new algorithm is one generator file in src/algo and one row here.
 */
#ifndef LOOM_CORE_REGISTRY_H
#define LOOM_CORE_REGISTRY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "algo.h"
#include "base.h"
#include "schedule.h"

/* Row indices; values are stable (they enter the schedule cache key and the shape hash). */
enum {
    ALGO_AUTO = -1,
    ALGO_RING = 0,
    ALGO_HIER,
    ALGO_HIER_LEADER,
    ALGO_PS,
    ALGO_RD,
    ALGO_RAB,
    ALGO_TREE,
    ALGO_HIER_TREE,
    ALGO_HIER_RAB,
    ALGO_HIER_RD,
    ALGO_DETERM, /* LOOM_DETERMINISTIC=1 (src/algo/determ.c) */
    ALGO_ONESHOT,
    ALGO_SEGMENT, /* the node segment's one-shot (core/nodeseg.c); its schedule is oneshot's */
    ALGO_COUNT
};

/* What the model and the applicability rules see of a communicator. The network link is the
 * tcp transport's; the node-local link is the memory transport's when one is started, else the
 * network's. */
typedef struct {
    int nranks, nnodes;
    double a_net, b_net; /* seconds per message, seconds per byte */
    double a_loc, b_loc;
    double gamma;    /* seconds per byte reduced on the host */
    bool shared_mem; /* a memory transport is started for same-node peers */
    /* The largest allreduce the node segment takes (nodeseg.h), 0: the communicator has none. */
    uint64_t seg_bytes;
    /* Some node has more ranks than cores: its ranks block instead of spinning, and every
     * dependent step costs a wake-up (registry.c, c_wake). The same on every rank. */
    bool oversubscribed;
    /* Where the constants come from, for the TUNING log: "measured (FILE:LINE)", or the
     * built-in defaults (comm.c's comm_model says which). */
    const char *source;
} registry_model_t;

/* One rank's allreduce schedule; hierarchical rows read the layout, the others ignore it. */
typedef void (*registry_gen_fn)(sched_t *s, uint16_t desc, const sched_topo_t *topo, uint64_t count,
                                const ring_params_t *prm, bool inplace, bool avg);

/* The rooted operations a row may have a form of besides allreduce (ring and tree do). */
enum { ROOTED_REDUCE, ROOTED_BROADCAST, ROOTED_COUNT };

/* One rank's reduce or broadcast schedule (avg: reduce only). */
typedef void (*registry_rooted_fn)(sched_t *s, uint16_t desc, uint64_t count, int root,
                                   const ring_params_t *prm, bool inplace, bool avg);

typedef struct {
    double (*cost)(const registry_model_t *m, double bytes); /* predicted seconds */
    registry_rooted_fn gen;
} registry_rooted_t;

typedef struct {
    const char *name;    /* LOOM_ALGO's value */
    const char *applies; /* when automatic selection considers it, in words (loom-info) */
    const char *doc;     /* one line (loom-info) */
    /* Why automatic selection cannot take this row on this layout (NULL: it can). LOOM_ALGO
     * runs any row on any layout. */
    const char *(*unfit)(const registry_model_t *m);
    /* The largest allreduce automatic selection gives it (NULL: no limit). */
    uint64_t (*max_bytes)(const registry_model_t *m);
    /* Predicted seconds for an allreduce of `bytes`. */
    double (*cost)(const registry_model_t *m, double bytes);
    /* Why this row wins on this layout whatever the costs say (NULL: it does not); for what
     * was measured and the model does not capture. */
    const char *(*preferred)(const registry_model_t *m, uint64_t bytes);
    registry_gen_fn gen;
    /* Its reduce and broadcast forms (indexed by ROOTED_*; zero: none). */
    registry_rooted_t rooted[ROOTED_COUNT];
} registry_algo_t;

/* The table, indexed by ALGO_*. */
extern const registry_algo_t registry_algos[ALGO_COUNT];

/* The row of id, NULL when id is not one. */
const registry_algo_t *registry_get(int id);

/* LOOM_ALGO's value: "" gives ALGO_AUTO; a name gives its row; anything else is an error whose
 * text lists the table's names. */
loomResult_t registry_parse(const char *name, int *algo);
/* The row named `name`, or -1 (nothing said). */
int registry_find(const char *name);

/* The automatic choice for an allreduce of `bytes` (m->nranks > 1): a row preferred on this
 * layout if there is one, else the fitting row the model predicts fastest (ties go to the
 * earlier row). */
int registry_pick(const registry_model_t *m, uint64_t bytes);
/* Why automatic selection cannot give row id an allreduce of `bytes` here (NULL: it can); a
 * measured table's row is checked with it. */
const char *registry_unfit(const registry_model_t *m, int id, uint64_t bytes);

/* Why `pick` was chosen, for the TUNING log: its prediction or its reason for preference, then
 * every other row as "n/a" with its reason or with its prediction and how it compares. Returns
 * buf. */
const char *registry_explain(const registry_model_t *m, uint64_t bytes, int pick, char *buf,
                             size_t len);

/* The same for reduce or broadcast (op: ROOTED_*), among the rows that have that form; the
 * explanation names the operation's candidates, and the others as "n/a (no reduce form)". */
int registry_pick_rooted(const registry_model_t *m, int op, uint64_t bytes);
const char *registry_explain_rooted(const registry_model_t *m, int op, uint64_t bytes, int pick,
                                    char *buf, size_t len);
/* The row that runs a reduce or broadcast when LOOM_ALGO says `forced`: forced itself if it has
 * that form, else -1 (the automatic choice). */
int registry_rooted_forced(int forced, int op);

#endif
