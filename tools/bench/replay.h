/*
 * A training step's gradients replayed (loom-fusion-bench, loom-tune): a model's tensor list
 * (data/fusion/<model>.csv, scripts/model_grads.py) laid out in one buffer per rank, filled with
 * exact-sum values, all-reduced in backward order one call per tensor, through a fusion context,
 * or as one monolithic call, optionally with simulated backward compute before each tensor (a
 * busy loop of flops x batch / rate seconds), then checked element by element.
 */
#ifndef LOOM_TOOLS_REPLAY_H
#define LOOM_TOOLS_REPLAY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "loom.h"

typedef struct {
    char name[96];
    size_t count;
    double flops; /* backward FLOPs of its layer for one sample */
} replay_tensor_t;

typedef struct {
    char name[64];
    replay_tensor_t *t; /* backward order */
    int n;
    size_t total; /* elements (float32) */
    double flops;
} replay_model_t;

/* Loads a list: a path, or a model name looked up in data/fusion. 0, or -1 with err. */
int replay_load(const char *what, replay_model_t *m, char *err, size_t errlen);
void replay_free_model(replay_model_t *m);

typedef enum { REPLAY_PER_TENSOR, REPLAY_FUSED, REPLAY_MONOLITHIC, REPLAY_COMPUTE_ONLY } replay_mode_t;

typedef struct {
    loomComm_t comm;
    int rank, nranks;
    const replay_model_t *m;
    float *flat;   /* every tensor, in list order */
    size_t *off;   /* tensor i at flat + off[i] */
    double spf;    /* simulated compute: seconds per FLOP of the list (0: none) */
    uint64_t wrong; /* elements wrong so far (checked after every step) */
    char err[512];
    /* --mem device: the tensors live in GPU memory (dflat), written and read back around each
     * step, all-reduced on `stream`; a step ends when the stream is done */
    bool dev;
    void *dflat;
    cudaStream_t stream;
} replay_t;

/* Allocates and fills the buffer (device: also in GPU memory, on the rank's GPU: its local
 * rank, modulo the GPUs seen). 0, or -1 with r->err. */
int replay_init(replay_t *r, loomComm_t comm, const replay_model_t *m, double spf, bool dev);
void replay_free(replay_t *r);

/* One step in `mode` (fusion: through fx, made by the caller on r->comm), with compute when
 * `compute`; returns the slowest rank's seconds from the step's start until every tensor is
 * all-reduced (the same value on every rank), negative on an error (r->err). The inputs are
 * refilled and the results checked outside the timed part. */
double replay_step(replay_t *r, replay_mode_t mode, loomFusion_t fx, bool compute);

/* A fusion context on r->comm with these settings (0: the library's default) and wire format
 * (loomFusionWire_t); NULL with r->err on failure. A step through a compressed context is checked
 * against the error bound the context reports, not bit for bit. */
loomFusion_t replay_fusion(replay_t *r, size_t bucket, size_t first, size_t segment,
                           uint64_t cycle_us, int wire);

#endif
