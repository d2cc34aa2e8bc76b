/*
 * Fusion's pure pieces (fuse.h): bucket digests, the low-precision codec, group fusion.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base.h"
#include "fuse.h"
#include "param.h"
#include "reduce.h"
#include "schedule.h"

uint64_t fuse_chain(uint64_t h, const fuse_segdesc_t *d)
{
    return base_hash64(d, sizeof(*d), h ^ 0x66757365ull);
}

/* ---- the wire codec ---- */

#define CHUNK_HDR 8 /* two floats */
#define CHUNK_WIRE (CHUNK_HDR + FUSE_CHUNK * 2)

size_t fuse_wire_bytes(size_t elems)
{
    return elems / FUSE_CHUNK * CHUNK_WIRE;
}

static float chunk_scale(float maxabs)
{
    if (!(maxabs > 0) || !isfinite(maxabs)) return 1.0f; /* zeros, or inf/NaN travel as they are */
    int e;
    (void)frexpf(maxabs, &e);                    /* maxabs = f * 2^e, f in [0.5, 1) */
    return ldexpf(1.0f, LOOM_MAX(e - 15, -126)); /* maxabs / scale in [2^14, 2^15) */
}

static loomDataType_t wire_type(int wire)
{
    return wire == loomFusionWireFp16 ? loomFloat16 : loomBfloat16;
}

/* A chunk at a time through stack buffers: every loop is a plain array loop the compiler
 * vectorises, and the conversions are the host reductions' own (F16C where present). */
/* bfloat16 of a finite float, rounded to nearest even, and back: on the bits, one pass the
 * compiler vectorises (red_narrow16's result for every finite input; NaN and infinity take the
 * general path, which keeps their payloads). */
static inline uint16_t bf16_rne(float f)
{
    uint32_t b;
    memcpy(&b, &f, sizeof(b));
    return (uint16_t)((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
}

static inline float bf16_widen(uint16_t v)
{
    uint32_t b = (uint32_t)v << 16;
    float f;
    memcpy(&f, &b, sizeof(f));
    return f;
}

void fuse_encode(int wire, const float *src, size_t n, size_t elems, const float *err, uint8_t *out)
{
    loomDataType_t wt = wire_type(wire);
    _Alignas(64) float x[FUSE_CHUNK], back[FUSE_CHUNK];
    _Alignas(64) uint16_t v[FUSE_CHUNK];
    for (size_t c = 0; c < elems / FUSE_CHUNK; c++) {
        size_t lo = c * FUSE_CHUNK, m = lo < n ? LOOM_MIN(FUSE_CHUNK, n - lo) : 0;
        /* The largest magnitude, as the largest bit pattern of |x|: for non-negative floats the
         * integer order is the float order, NaN's patterns lie above infinity's, and an integer
         * maximum vectorises where a float one (NaN's rules) does not. */
        uint32_t abits = 0;
        for (size_t i = 0; i < m; i++) {
            uint32_t b;
            memcpy(&b, &src[lo + i], sizeof(b));
            b &= 0x7fffffffu;
            abits = b > abits ? b : abits;
        }
        bool finite = abits < 0x7f800000u; /* false for inf and NaN */
        float amax;
        memcpy(&amax, &abits, sizeof(amax));
        float scale = finite ? chunk_scale(amax) : 1.0f, inv = 1.0f / scale;
        float maxerr = 0;
        if (finite && wt == loomBfloat16) {
            /* the common case in one pass: scale, round, and the error of the rounding (the
             * same numbers as the general path's; errors are finite and non-negative, so their
             * maximum is taken on the bits too) */
            uint32_t ebits = 0;
            for (size_t i = 0; i < m; i++) {
                v[i] = bf16_rne(src[lo + i] * inv);
                float e = fabsf(bf16_widen(v[i]) * scale - src[lo + i]);
                uint32_t b;
                memcpy(&b, &e, sizeof(b));
                ebits = b > ebits ? b : ebits;
            }
            memcpy(&maxerr, &ebits, sizeof(maxerr));
            for (size_t i = m; i < FUSE_CHUNK; i++)
                v[i] = 0;
        } else {
            for (size_t i = 0; i < FUSE_CHUNK; i++)
                x[i] = i < m ? src[lo + i] * inv : 0.0f;
            red_narrow16(wt, v, x, FUSE_CHUNK);
            if (err == NULL) {
                red_widen16(wt, back, v, FUSE_CHUNK);
                for (size_t i = 0; i < m; i++) {
                    float e = fabsf(back[i] * scale - src[lo + i]);
                    maxerr = e > maxerr ? e : maxerr;
                }
            }
        }
        uint8_t *ck = out + c * CHUNK_WIRE;
        float hdr[2] = {scale, err ? err[c] : maxerr};
        memcpy(ck, hdr, sizeof(hdr));
        memcpy(ck + CHUNK_HDR, v, sizeof(v));
    }
}

void fuse_decode(int wire, const uint8_t *in, size_t elems, float *dst, bool accumulate,
                 float *hdr_err, float *maxabs)
{
    loomDataType_t wt = wire_type(wire);
    _Alignas(64) float x[FUSE_CHUNK];
    for (size_t c = 0; c < elems / FUSE_CHUNK; c++) {
        const uint8_t *ck = in + c * CHUNK_WIRE;
        float hdr[2];
        memcpy(hdr, ck, sizeof(hdr));
        if (wt == loomBfloat16) {
            _Alignas(64) uint16_t v[FUSE_CHUNK];
            memcpy(v, ck + CHUNK_HDR, sizeof(v));
            for (size_t i = 0; i < FUSE_CHUNK; i++)
                x[i] = bf16_widen(v[i]);
        } else {
            red_widen16(wt, x, ck + CHUNK_HDR, FUSE_CHUNK);
        }
        float *d = dst + c * FUSE_CHUNK, m;
        uint32_t mbits = 0; /* the largest |x| on the bits, as in fuse_encode; NaN left out */
        for (size_t i = 0; i < FUSE_CHUNK; i++) {
            x[i] *= hdr[0];
            uint32_t b;
            memcpy(&b, &x[i], sizeof(b));
            b &= 0x7fffffffu;
            b = b > 0x7f800000u ? 0 : b;
            mbits = b > mbits ? b : mbits;
        }
        memcpy(&m, &mbits, sizeof(m));
        if (accumulate)
            for (size_t i = 0; i < FUSE_CHUNK; i++)
                d[i] += x[i];
        else
            memcpy(d, x, sizeof(x));
        if (hdr_err) hdr_err[c] = hdr[1];
        if (maxabs) maxabs[c] = m;
    }
}

float fuse_chunk_err(const uint8_t *in, size_t c)
{
    float v;
    memcpy(&v, in + c * CHUNK_WIRE + 4, sizeof(v));
    return v;
}

void fuse_set_chunk_err(uint8_t *out, size_t c, float v)
{
    memcpy(out + c * CHUNK_WIRE + 4, &v, sizeof(v));
}

/* ---- group fusion ---- */

static bool fusable(const coll_op_t *o, size_t max_bytes)
{
    return o->kind == OPK_ALLREDUCE && !o->dev && o->count > 0 && o->tag == 0 &&
           o->count * red_type_size(o->type) <= max_bytes;
}

loomResult_t fuse_group(coll_op_t *q, int *nq, fuse_run_t **runs_out, int *nruns,
                        coll_op_t **orig_out)
{
    int n = *nq;
    *nruns = 0;
    *runs_out = NULL;
    *orig_out = NULL;
    size_t max_bytes = param_size(PARAM_FUSION_GROUP);
    if (max_bytes == 0 || n < 2) return loomSuccess;
    /* A quick look first: most groups (point to point, one call) fuse nothing. */
    int cand = 0;
    for (int i = 0; i < n; i++)
        cand += fusable(&q[i], max_bytes);
    if (cand < 2) return loomSuccess;
    size_t cap = LOOM_MAX(param_size(PARAM_FUSION_BUCKET), max_bytes);
    int *run_of = malloc((size_t)n * sizeof(int)), *idx = malloc((size_t)n * sizeof(int));
    fuse_run_t *runs = calloc((size_t)n, sizeof(*runs));
    coll_op_t *orig = malloc((size_t)n * sizeof(*orig));
    if (!run_of || !idx || !runs || !orig) {
        free(run_of), free(idx), free(runs), free(orig);
        return base_error(loomSystemError, LOG_COLL, "out of memory (group fusion)");
    }
    memcpy(orig, q, (size_t)n * sizeof(*orig));
    for (int i = 0; i < n; i++)
        run_of[i] = -1;
    int nr = 0, used = 0;
    loomResult_t res = loomSuccess;
    for (int i = 0; i < n && res == loomSuccess; i++) {
        if (run_of[i] >= 0 || !fusable(&orig[i], max_bytes)) continue;
        const coll_op_t *a = &orig[i];
        size_t es = red_type_size(a->type), total = a->count;
        int k = 0;
        idx[used + k++] = i;
        for (int j = i + 1; j < n; j++) {
            const coll_op_t *b = &orig[j];
            if (b->comm != a->comm) continue; /* other communicators' calls do not break a run */
            if (!fusable(b, max_bytes) || b->type != a->type || b->op != a->op ||
                (total + b->count) * es > cap)
                break;
            idx[used + k++] = j;
            total += b->count;
        }
        if (k < 2) continue;
        fuse_run_t *r = &runs[nr];
        r->idx = idx + used;
        r->n = k;
        r->scratch = malloc(total * es);
        if (r->scratch == NULL) {
            res = base_error(loomSystemError, LOG_COLL, "out of memory (group fusion, %zu bytes)",
                             total * es);
            break;
        }
        /* the digest of the run (counts in order, type, op): ranks that grouped different
         * calls fail the fused call with a mismatch instead of adding unlike tensors */
        uint64_t tag = 0x67726f7570ull; /* "group" */
        size_t off = 0;
        for (int m = 0; m < k; m++) {
            const coll_op_t *o = &orig[r->idx[m]];
            fuse_segdesc_t d = {.id = (uint64_t)m,
                                .count = o->count,
                                .off = 0,
                                .len = o->count,
                                .type = (uint32_t)o->type,
                                .op = (uint32_t)o->op};
            tag = fuse_chain(tag, &d);
            memcpy((uint8_t *)r->scratch + off * es, o->send, o->count * es);
            off += o->count;
            run_of[r->idx[m]] = nr;
        }
        r->tag = tag;
        used += k;
        nr++;
    }
    if (res != loomSuccess || nr == 0) {
        fuse_group_finish(loomInvalidUsage, runs, nr, orig);
        free(run_of);
        if (nr == 0) free(idx);
        return res;
    }
    /* the queue again: a run's fused call where its first member was */
    int m = 0;
    for (int i = 0; i < n; i++) {
        int r = run_of[i];
        if (r < 0) {
            q[m++] = orig[i];
        } else if (runs[r].idx[0] == i) {
            const coll_op_t *a = &orig[i];
            size_t total = 0;
            for (int k = 0; k < runs[r].n; k++)
                total += orig[runs[r].idx[k]].count;
            q[m] = *a;
            q[m].send = q[m].recv = runs[r].scratch;
            q[m].count = total;
            q[m].tag = runs[r].tag | 1; /* never 0: a plain call */
            m++;
        }
    }
    free(run_of);
    *nq = m;
    *runs_out = runs;
    *nruns = nr;
    *orig_out = orig;
    return loomSuccess;
}

void fuse_group_finish(loomResult_t res, fuse_run_t *runs, int nruns, coll_op_t *orig)
{
    for (int r = 0; r < nruns; r++) {
        if (runs[r].scratch && res == loomSuccess) {
            size_t off = 0;
            for (int k = 0; k < runs[r].n; k++) {
                const coll_op_t *o = &orig[runs[r].idx[k]];
                size_t es = red_type_size(o->type);
                memcpy(o->recv, (uint8_t *)runs[r].scratch + off * es, o->count * es);
                off += o->count;
            }
        }
        free(runs[r].scratch);
    }
    if (nruns > 0) free(runs[0].idx); /* one array for all runs */
    free(runs);
    free(orig);
}
