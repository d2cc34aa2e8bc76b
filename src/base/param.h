/*
 * Parameters: one declared table (name, type, default, unit, doc, accepted values). Each is read
 * from the environment as LOOM_<NAME> on first use, checked against its accepted values, and
 * cached; loom-info lists them all. A value outside them is a WARN line naming the variable,
 * the value, what is accepted and what is used instead (the default, or the nearest bound); a
 * value naming a choice the reader cannot replace (a forced algorithm, transport or address
 * family) is left to the reader, which refuses it with an error.
 */
#ifndef LOOM_BASE_PARAM_H
#define LOOM_BASE_PARAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum { PARAM_T_INT, PARAM_T_SIZE, PARAM_T_STR, PARAM_T_DOUBLE } param_type_t;

typedef enum {
    PARAM_DEBUG,
    PARAM_DEBUG_SUBSYS,
    PARAM_DEBUG_FILE,
    PARAM_TIMEOUT,
    PARAM_HANDSHAKE_TIMEOUT,
    PARAM_OP_TIMEOUT,
    PARAM_SOCKET_IFNAME,
    PARAM_SOCKET_FAMILY,
    PARAM_NSOCKS_PERPEER,
    PARAM_NCHANNELS,
    PARAM_SLICE_SIZE,
    PARAM_SLICES_IN_FLIGHT,
    PARAM_MAX_MESSAGE,
    PARAM_ALGO,
    PARAM_TRANSPORT,
    PARAM_SOCKET_BUFFER,
    PARAM_SPIN_US,
    PARAM_NODE_ID,
    PARAM_JOB_SECRET,
    PARAM_CUDA_BLOCKS,
    PARAM_CUDA_SLOT,
    PARAM_CUDA_NSLOT,
    PARAM_CUDA_THREADS,
    PARAM_CUDA_PUSH_THREADS,
    PARAM_CUDA_COUPLE,
    PARAM_CUDA_DIRECT,
    PARAM_CUDA_EMPTY,
    PARAM_CUDA_ONESHOT,
    PARAM_CUDA_STAGE_CHUNK,
    PARAM_CUDA_LL,
    PARAM_CUDA_PDL,
    PARAM_CUDA_COUNTED,
    PARAM_CUDA_SHARE_GPU,
    PARAM_SHM_READ_STALL_MS,
    PARAM_CUDA_CE,
    PARAM_CUDA_CE_SCRATCH,
    PARAM_CUDA_CE_BLOCKS,
    PARAM_CUDA_CE_STREAMS,
    PARAM_FUSION_BUCKET,
    PARAM_FUSION_FIRST_BUCKET,
    PARAM_FUSION_SEGMENT,
    PARAM_FUSION_CYCLE_US,
    PARAM_SEGMENT,
    PARAM_FUSION_WIRE,
    PARAM_FUSION_WIRE_PIECE,
    PARAM_FUSION_GROUP,
    PARAM_TUNE_FILE,
    PARAM_DETERMINISTIC,
    PARAM_SECURE,
    PARAM_SHM_CMA,
    PARAM_COUNT
} param_id_t;

/* What a value outside the accepted ones becomes. */
typedef enum {
    PARAM_BAD_DEFAULT, /* the default, with a WARN */
    PARAM_BAD_CLAMP,   /* numbers: the nearest bound, with a WARN (unparsable: the default) */
    PARAM_BAD_READER,  /* names: passed on as given; its reader fails with an error */
} param_bad_t;

/* A timeout of "inf" means no limit, held as this many seconds (31 years): every conversion to
 * nanoseconds stays finite and in range, and no wait is cut short. */
#define PARAM_NO_LIMIT_S 1e9

typedef struct {
    const char *name; /* without the LOOM_ prefix */
    param_type_t type;
    const char *def;  /* default as text, "" for none */
    const char *unit; /* "s", "bytes", "" */
    const char *doc;
    /* Accepted values. Numbers: min..max inclusive (max INFINITY: no bound); with `inf`,
     * "inf" is accepted too and means no limit (PARAM_NO_LIMIT_S). Strings: `names`, '|'
     * between them, matched in any case and handed on in the table's spelling (NULL: any
     * text); with `list`, a comma-separated list of names, optionally after '^'. */
    double min, max;
    bool inf;
    const char *names;
    bool list;
    param_bad_t bad;
} param_desc_t;

const param_desc_t *param_desc(param_id_t id);
/* The value as text: the environment's if set, else the default. */
const char *param_text(param_id_t id);
bool param_is_set(param_id_t id);
int64_t param_int(param_id_t id);
uint64_t param_size(param_id_t id);
double param_double(param_id_t id);
const char *param_str(param_id_t id);
/* The accepted values as text ("[1, 16]", "NONE|WARN|INFO|TRACE", "any"), for loom-info and
 * the warnings. */
const char *param_range_text(param_id_t id, char *buf, size_t len);
/* Forget one cached value: the next read takes the environment's again. */
void param_forget(param_id_t id);
/* Forget cached values (tests that change the environment). */
void param_reset_cache(void);

#endif
