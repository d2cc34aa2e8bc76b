/* Coarse-to-fine search (search.h). */
#include "search.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double tune_measure(tune_cost_fn fn, void *arg, const uint64_t *vals, int reps, double *lo,
                    double *hi)
{
    double t[64];
    if (reps < 1) reps = 1;
    if (reps > 64) reps = 64;
    for (int i = 0; i < reps; i++)
        if ((t[i] = fn(arg, vals)) < 0) return -1;
    qsort(t, (size_t)reps, sizeof(double), cmp_double);
    if (lo) *lo = t[0];
    if (hi) *hi = t[reps - 1];
    return reps % 2 ? t[reps / 2] : (t[reps / 2 - 1] + t[reps / 2]) / 2;
}

static uint64_t clamp_align(const tune_dim_t *d, double v)
{
    uint64_t a = d->align ? d->align : 1;
    if (v < (double)d->lo) v = (double)d->lo;
    if (v > (double)d->hi) v = (double)d->hi;
    uint64_t x = (uint64_t)llround(v / (double)a) * a;
    if (x < d->lo) x += a;
    if (x > d->hi) x -= a;
    return x < d->lo ? d->lo : x;
}

/* The remembered point of vals, or NULL. */
static const tune_point_t *find(const tune_search_t *s, const uint64_t *vals)
{
    for (int i = 0; i < s->npts; i++)
        if (memcmp(s->pts[i].vals, vals, sizeof(uint64_t) * (size_t)s->ndims) == 0)
            return &s->pts[i];
    return NULL;
}

static void update_noise(tune_search_t *s)
{
    double *r = malloc(sizeof(double) * (size_t)s->npts);
    if (!r) return;
    for (int i = 0; i < s->npts; i++)
        r[i] = s->pts[i].med > 0 ? (s->pts[i].max - s->pts[i].min) / (2 * s->pts[i].med) : 0;
    qsort(r, (size_t)s->npts, sizeof(double), cmp_double);
    s->noise = r[s->npts / 2];
    free(r);
}

/* Measures vals (unless known); its median time, negative on failure. */
static double point(tune_search_t *s, tune_cost_fn fn, void *arg, const uint64_t *vals, int dim,
                    const char *stage)
{
    const tune_point_t *k = find(s, vals);
    if (k) return k->med;
    if (s->npts == s->cap) {
        int cap = s->cap ? s->cap * 2 : 32;
        tune_point_t *np = realloc(s->pts, sizeof(*np) * (size_t)cap);
        if (!np) return -1;
        s->pts = np, s->cap = cap;
    }
    tune_point_t p = {.dim = dim, .stage = stage};
    memcpy(p.vals, vals, sizeof(uint64_t) * (size_t)s->ndims);
    p.med = tune_measure(fn, arg, vals, s->reps, &p.min, &p.max);
    if (p.med < 0) return -1;
    s->pts[s->npts++] = p;
    update_noise(s);
    return p.med;
}

int tune_search_run(tune_search_t *s, tune_cost_fn fn, void *arg)
{
    uint64_t cur[TUNE_MAX_DIMS] = {0};
    for (int d = 0; d < s->ndims; d++)
        cur[d] = clamp_align(&s->dims[d], (double)s->dims[d].start);
    s->best_time = -1;
    static const struct {
        double step;
        const char *name;
    } fine[] = {{2, "x2"}, {1.4142135623730951, "x1.41"}, {1.189207115002721, "x1.19"}};
    for (int d = 0; d < s->ndims; d++) {
        tune_dim_t lim = s->dims[d];
        const tune_dim_t *dd = &lim;
        if (lim.at_most > 0 && lim.at_most - 1 < d && cur[lim.at_most - 1] < lim.hi)
            lim.hi = cur[lim.at_most - 1] > lim.lo ? cur[lim.at_most - 1] : lim.lo;
        cur[d] = clamp_align(dd, (double)cur[d]);
        uint64_t v[TUNE_MAX_DIMS];
        memcpy(v, cur, sizeof(v));
        uint64_t best = 0;
        double bt = -1;
        /* coarse: powers of 4 from lo, and hi itself */
        for (double x = (double)(dd->lo ? dd->lo : 1);; x *= 4) {
            v[d] = clamp_align(dd, x);
            double t = point(s, fn, arg, v, d, "x4");
            if (t < 0) return s->failed = 1, -1;
            if (bt < 0 || t < bt) bt = t, best = v[d];
            if (v[d] >= dd->hi) break;
        }
        /* finer steps around the best, while each gains more than the noise */
        for (size_t f = 0; f < sizeof(fine) / sizeof(fine[0]); f++) {
            double before = bt;
            uint64_t around = best;
            for (int side = -1; side <= 1; side += 2) {
                v[d] = clamp_align(dd, side < 0 ? (double)around / fine[f].step
                                                : (double)around * fine[f].step);
                double t = point(s, fn, arg, v, d, fine[f].name);
                if (t < 0) return s->failed = 1, -1;
                if (t < bt) bt = t, best = v[d];
            }
            if ((before - bt) / before < s->noise) break;
        }
        cur[d] = best;
        s->best_time = bt;
    }
    memcpy(s->best, cur, sizeof(cur));
    return 0;
}

static void fmt_val(char *b, size_t n, uint64_t v)
{
    if (v >= (1u << 20) && v % (1u << 20) == 0)
        snprintf(b, n, "%lluM", (unsigned long long)(v >> 20));
    else if (v >= 1024 && v % 1024 == 0)
        snprintf(b, n, "%lluK", (unsigned long long)(v >> 10));
    else
        snprintf(b, n, "%llu", (unsigned long long)v);
}

void tune_search_print(const tune_search_t *s, FILE *f)
{
    fprintf(f, "#  %-6s", "stage");
    for (int d = 0; d < s->ndims; d++)
        fprintf(f, " %12s", s->dims[d].name);
    fprintf(f, " %12s %12s %12s\n", "median_us", "min_us", "max_us");
    for (int i = 0; i < s->npts; i++) {
        const tune_point_t *p = &s->pts[i];
        bool best = memcmp(p->vals, s->best, sizeof(uint64_t) * (size_t)s->ndims) == 0;
        fprintf(f, "%s  %-6s", best ? "*" : " ", p->stage);
        for (int d = 0; d < s->ndims; d++) {
            char b[32];
            fmt_val(b, sizeof(b), p->vals[d]);
            fprintf(f, " %12s", b);
        }
        fprintf(f, " %12.1f %12.1f %12.1f\n", p->med * 1e6, p->min * 1e6, p->max * 1e6);
    }
    fprintf(f, "# chosen:");
    for (int d = 0; d < s->ndims; d++) {
        char b[32];
        fmt_val(b, sizeof(b), s->best[d]);
        fprintf(f, " %s=%s", s->dims[d].name, b);
    }
    fprintf(f, " (%.1f us), %d points x %d repetitions, noise %.1f%%\n", s->best_time * 1e6,
            s->npts, s->reps, s->noise * 100);
}

void tune_search_free(tune_search_t *s)
{
    free(s->pts);
    s->pts = NULL;
    s->npts = s->cap = 0;
}
