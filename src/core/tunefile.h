/*
 * The tuning file (LOOM_TUNE_FILE): what loom-tune measured and chose, read at communicator
 * init. Text, one section per key, keys then values:
 *
 *   # comments run to the end of the line
 *   [ranks=4 layout=1x4 mem=host]
 *   fusion_threshold = 4194304      # bytes: a bucket starts once it holds this much
 *   fusion_segment = 1048576        # bytes: larger tensors are cut into pieces of this size
 *   alpha.shm.local = 4.1e-06       # seconds per message, shm inside a node
 *   beta.shm.local = 2.3e-10        # seconds per byte
 *   alpha.tcp.net = 3.5e-05         # tcp across nodes (tcp.local: tcp inside a node)
 *   gamma = 2.0e-10                 # seconds per byte reduced on the host
 *   allreduce_algos = 0:segment 24576:rd 49152:rabenseifner 1572864:ring
 *                                   # measured winners: from N bytes on, that algorithm
 *
 * A section's key is the communicator size, its layout (nodes x ranks per node; a layout with
 * unequal nodes matches only "*") and the memory type (host or device); any of them may be
 * "*". Every section that fits a communicator applies, the less specific first (fewer fields
 * given), so a more specific section overrides; among equally specific ones the later wins.
 * A malformed line (unknown name, unparsable or out-of-range value, a value before any section,
 * a broken header) is a WARN naming the file and the line, and is skipped.
 */
#ifndef LOOM_CORE_TUNEFILE_H
#define LOOM_CORE_TUNEFILE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

enum { TUNE_TCP = 0, TUNE_SHM, TUNE_NTP };      /* transports the model knows */
enum { TUNE_LOCAL = 0, TUNE_NET, TUNE_NLEVEL }; /* inside a node, across nodes */
enum { TUNE_MEM_HOST = 0, TUNE_MEM_DEVICE, TUNE_NMEM };
/* Rows of a measured allreduce table (allreduce_algos). */
#define TUNE_MAX_ALGOS 16

extern const char *const tune_tp_names[TUNE_NTP];       /* "tcp", "shm" */
extern const char *const tune_level_names[TUNE_NLEVEL]; /* "local", "net" */
extern const char *const tune_mem_names[TUNE_NMEM];     /* "host", "device" */

/* A section's key; -1 in a field: "*" (any). */
typedef struct {
    int nranks;
    int nnodes, per_node; /* both -1, or both given */
    int mem;
} tune_key_t;

/* What applies to one communicator and memory type. Absent values: 0 for sizes, a negative
 * number for constants. */
typedef struct {
    int sections;    /* how many sections applied */
    char where[288]; /* "path:line" of the most specific section that applied */
    uint64_t fusion_threshold, fusion_segment;
    double fusion_cycle_us;
    double alpha[TUNE_NTP][TUNE_NLEVEL]; /* seconds per message */
    double beta[TUNE_NTP][TUNE_NLEVEL];  /* seconds per byte */
    double gamma;                        /* seconds per byte reduced */
    /* allreduce_algos: from algo_from[i] bytes (ascending) on, row algo_id[i] (registry.h's
     * ALGO_*) won when measured; sizes below algo_from[0] are the model's. 0 rows: none. */
    int nalgos;
    uint64_t algo_from[TUNE_MAX_ALGOS];
    int algo_id[TUNE_MAX_ALGOS];
} tune_entry_t;

/* The measured table's row for an allreduce of `bytes`, or -1 (no table, or below its first
 * size). */
int tune_entry_algo(const tune_entry_t *e, uint64_t bytes);

/* An entry with nothing in it. */
void tune_entry_clear(tune_entry_t *e);

/* The key of a communicator: node sizes equal give nnodes x per_node, else -1 x -1. */
tune_key_t tune_key_of(int nranks, int nnodes, const int *node_start, int mem);

/* Applies every section of `path` that fits `key` (all fields given) onto `out` (cleared
 * first). Returns false when the file cannot be read; with warn, that and every malformed line
 * is a WARN naming the file and the line. */
bool tunefile_read(const char *path, const tune_key_t *key, tune_entry_t *out, bool warn);

/* The file with the section of exactly `key` replaced by `e` (the present values of `e`,
 * merged over those of the old section), other sections kept as they were; written to a
 * temporary file and renamed over path. Returns 0, or -1 with errno and a message in err. */
int tunefile_update(const char *path, const tune_key_t *key, const tune_entry_t *e, char *err,
                    size_t errlen);

/* One section, as tunefile_update writes it. */
void tunefile_write_section(FILE *f, const tune_key_t *key, const tune_entry_t *e);

#endif
