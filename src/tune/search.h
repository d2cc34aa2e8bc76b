/*
 * Coarse-to-fine search (loom-tune): finds the values of a few integer parameters (sizes) that
 * minimise a measured time. Each parameter in turn, the others held: powers of 4 across its
 * range first, then around the best the powers of 2, then steps of 2^(1/2) and 2^(1/4); every
 * point measured `reps` times (median kept, spread recorded); the refinement stops as soon as a
 * stage gains less than the noise measured so far (the median relative half-spread of the
 * repetitions). Points are measured once and remembered.
 *
 * The cost function runs collectives, so every rank must take the same decisions: it must
 * return a value that is the same on every rank (for example the maximum over the ranks,
 * agreed by an allreduce), which makes the whole search the same everywhere.
 */
#ifndef LOOM_TUNE_SEARCH_H
#define LOOM_TUNE_SEARCH_H

#include <stdint.h>
#include <stdio.h>

#define TUNE_MAX_DIMS 4

/* One measurement of the point vals[0..ndims) in seconds (same value on every rank); negative:
 * the point failed (the search stops and reports it). */
typedef double (*tune_cost_fn)(void *arg, const uint64_t *vals);

typedef struct {
    const char *name;
    uint64_t lo, hi; /* the range, inclusive */
    uint64_t start;  /* its value while earlier parameters are searched */
    uint64_t align;  /* values are rounded to a multiple of this (1: any) */
    int at_most;     /* k > 0: at most the value of parameter k-1 (searched earlier) */
} tune_dim_t;

typedef struct {
    uint64_t vals[TUNE_MAX_DIMS];
    double med, min, max; /* seconds over the repetitions */
    int dim;              /* the parameter being searched when it was measured */
    const char *stage;    /* "x4", "x2", "x1.41", "x1.19" */
} tune_point_t;

typedef struct {
    int ndims;
    tune_dim_t dims[TUNE_MAX_DIMS];
    int reps; /* repetitions per point (>= 1) */
    /* results */
    tune_point_t *pts;
    int npts, cap;
    double noise; /* relative: median half-spread over median, over the points measured */
    uint64_t best[TUNE_MAX_DIMS];
    double best_time;
    int failed; /* the cost function failed (negative value) */
} tune_search_t;

/* Runs the search (dims, ndims and reps set by the caller); 0, or -1 when a measurement failed. */
int tune_search_run(tune_search_t *s, tune_cost_fn fn, void *arg);

/* The median of reps measurements of one point, min and max through lo/hi (may be NULL);
 * negative when one failed. */
double tune_measure(tune_cost_fn fn, void *arg, const uint64_t *vals, int reps, double *lo,
                    double *hi);

/* The table of every point tried, in order, the best marked, then the choice and the noise. */
void tune_search_print(const tune_search_t *s, FILE *f);

void tune_search_free(tune_search_t *s);

#endif
