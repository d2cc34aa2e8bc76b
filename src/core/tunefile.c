/* The tuning file (tunefile.h). */
#include "tunefile.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base.h"
#include "registry.h"

const char *const tune_tp_names[TUNE_NTP] = {"tcp", "shm"};
const char *const tune_level_names[TUNE_NLEVEL] = {"local", "net"};
const char *const tune_mem_names[TUNE_NMEM] = {"host", "device"};

void tune_entry_clear(tune_entry_t *e)
{
    memset(e, 0, sizeof(*e));
    e->fusion_cycle_us = -1;
    e->gamma = -1;
    for (int t = 0; t < TUNE_NTP; t++)
        for (int l = 0; l < TUNE_NLEVEL; l++)
            e->alpha[t][l] = e->beta[t][l] = -1;
}

tune_key_t tune_key_of(int nranks, int nnodes, const int *node_start, int mem)
{
    tune_key_t k = {.nranks = nranks, .nnodes = nnodes, .per_node = -1, .mem = mem};
    int g = node_start[1] - node_start[0];
    for (int n = 1; n < nnodes; n++)
        if (node_start[n + 1] - node_start[n] != g) g = -1;
    if (g < 0) k.nnodes = -1;
    k.per_node = g;
    return k;
}

static char *trim(char *s)
{
    while (*s == ' ' || *s == '\t')
        s++;
    size_t n = strlen(s);
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\n' || s[n - 1] == '\r'))
        s[--n] = '\0';
    return s;
}

/* "[ranks=4 layout=1x4 mem=host]" (s trimmed, starting with '['): 0, or -1 with why. */
static int parse_header(char *s, tune_key_t *k, const char **why)
{
    *k = (tune_key_t){-1, -1, -1, -1};
    size_t n = strlen(s);
    if (n < 2 || s[n - 1] != ']') return *why = "a section header ends with ']'", -1;
    s[n - 1] = '\0';
    char *save = NULL;
    for (char *t = strtok_r(s + 1, " \t", &save); t; t = strtok_r(NULL, " \t", &save)) {
        char *eq = strchr(t, '=');
        if (!eq) return *why = "a key field is name=value (ranks, layout, mem)", -1;
        *eq = '\0';
        const char *v = eq + 1;
        bool any = strcmp(v, "*") == 0;
        char *end;
        if (strcmp(t, "ranks") == 0) {
            long r = any ? -1 : strtol(v, &end, 10);
            if (!any && (*end || end == v || r < 1 || r > 1 << 20))
                return *why = "ranks= takes a rank count or *", -1;
            k->nranks = (int)r;
        } else if (strcmp(t, "layout") == 0) {
            if (any) continue;
            long a = strtol(v, &end, 10), b = 0;
            if (end != v && *end == 'x') {
                const char *w = end + 1;
                b = strtol(w, &end, 10);
                if (end == w) b = 0;
            }
            if (*end || a < 1 || b < 1 || a > 1 << 20 || b > 1 << 20)
                return *why = "layout= takes NODESxRANKS_PER_NODE (e.g. 2x4) or *", -1;
            k->nnodes = (int)a, k->per_node = (int)b;
        } else if (strcmp(t, "mem") == 0) {
            if (any) continue;
            int m = -1;
            for (int i = 0; i < TUNE_NMEM; i++)
                if (strcmp(v, tune_mem_names[i]) == 0) m = i;
            if (m < 0) return *why = "mem= takes host, device or *", -1;
            k->mem = m;
        } else {
            return *why = "unknown key field (ranks, layout, mem)", -1;
        }
    }
    return 0;
}

static bool key_fits(const tune_key_t *sec, const tune_key_t *k)
{
    return (sec->nranks < 0 || sec->nranks == k->nranks) &&
           (sec->nnodes < 0 || (sec->nnodes == k->nnodes && sec->per_node == k->per_node)) &&
           (sec->mem < 0 || sec->mem == k->mem);
}

static bool key_equal(const tune_key_t *a, const tune_key_t *b)
{
    return a->nranks == b->nranks && a->nnodes == b->nnodes && a->per_node == b->per_node &&
           a->mem == b->mem;
}

static int key_score(const tune_key_t *k)
{
    return (k->nranks >= 0) + (k->nnodes >= 0) + (k->mem >= 0);
}

int tune_entry_algo(const tune_entry_t *e, uint64_t bytes)
{
    int id = -1;
    for (int i = 0; i < e->nalgos && e->algo_from[i] <= bytes; i++)
        id = e->algo_id[i];
    return id;
}

/* "FROM:NAME FROM:NAME ...", sizes ascending, names LOOM_ALGO's (not auto): 0, or -1 with why
 * (e untouched). */
static int parse_algos(char *val, tune_entry_t *e, const char **why)
{
    uint64_t from[TUNE_MAX_ALGOS];
    int id[TUNE_MAX_ALGOS], n = 0;
    for (char *save = NULL, *tok = strtok_r(val, " \t", &save); tok;
         tok = strtok_r(NULL, " \t", &save)) {
        char *colon = strchr(tok, ':'), *end;
        if (!colon) return *why = "allreduce_algos is a list of BYTES:ALGORITHM", -1;
        *colon = '\0';
        errno = 0;
        unsigned long long b = strtoull(tok, &end, 10);
        if (end == tok || *end || errno || tok[0] == '-')
            return *why = "allreduce_algos: a size is a whole number of bytes", -1;
        if (n == TUNE_MAX_ALGOS) return *why = "allreduce_algos: more than 16 rows", -1;
        if (n > 0 && b <= from[n - 1])
            return *why = "allreduce_algos: the sizes must rise from row to row", -1;
        int a = registry_find(colon + 1);
        if (a < 0) return *why = "allreduce_algos: an unknown algorithm (loom-info lists them)", -1;
        from[n] = b, id[n++] = a;
    }
    if (n == 0) return *why = "allreduce_algos: no rows", -1;
    e->nalgos = n;
    memcpy(e->algo_from, from, sizeof(from[0]) * (size_t)n);
    memcpy(e->algo_id, id, sizeof(id[0]) * (size_t)n);
    return 0;
}

/* "name = value" onto e: 0, or -1 with why. */
static int parse_value(char *s, tune_entry_t *e, const char **why)
{
    char *eq = strchr(s, '=');
    if (!eq) return *why = "a value line is name = value", -1;
    *eq = '\0';
    char *name = trim(s), *val = trim(eq + 1), *end;
    if (strcmp(name, "allreduce_algos") == 0) return parse_algos(val, e, why);
    errno = 0;
    double d = strtod(val, &end);
    if (end == val || *end || errno || !isfinite(d) || d < 0)
        return *why = "the value is not a finite number >= 0", -1;
    if (strcmp(name, "fusion_threshold") == 0 || strcmp(name, "fusion_segment") == 0) {
        if (d < 1 || d > 1e15 || d != floor(d))
            return *why = "a size is a whole number of bytes from 1", -1;
        *(name[7] == 't' ? &e->fusion_threshold : &e->fusion_segment) = (uint64_t)d;
        return 0;
    }
    if (strcmp(name, "fusion_cycle_us") == 0) return e->fusion_cycle_us = d, 0;
    if (strcmp(name, "gamma") == 0) return e->gamma = d, 0;
    bool a = strncmp(name, "alpha.", 6) == 0, b = strncmp(name, "beta.", 5) == 0;
    if (a || b) {
        const char *rest = name + (a ? 6 : 5);
        for (int t = 0; t < TUNE_NTP; t++)
            for (int l = 0; l < TUNE_NLEVEL; l++) {
                char want[32];
                snprintf(want, sizeof(want), "%s.%s", tune_tp_names[t], tune_level_names[l]);
                if (strcmp(rest, want) != 0) continue;
                if (d > 10) return *why = "a constant above 10 seconds", -1;
                *(a ? &e->alpha[t][l] : &e->beta[t][l]) = d;
                return 0;
            }
    }
    return *why =
               "unknown name (fusion_threshold, fusion_segment, fusion_cycle_us, gamma, "
               "allreduce_algos, alpha.TP.LEVEL, beta.TP.LEVEL with TP tcp|shm, LEVEL local|net)",
           -1;
}

/* Present values of src over dst. */
static void entry_merge(tune_entry_t *dst, const tune_entry_t *src)
{
    if (src->fusion_threshold) dst->fusion_threshold = src->fusion_threshold;
    if (src->fusion_segment) dst->fusion_segment = src->fusion_segment;
    if (src->fusion_cycle_us >= 0) dst->fusion_cycle_us = src->fusion_cycle_us;
    if (src->gamma >= 0) dst->gamma = src->gamma;
    if (src->nalgos > 0) { /* a table is taken whole */
        dst->nalgos = src->nalgos;
        memcpy(dst->algo_from, src->algo_from, sizeof(src->algo_from));
        memcpy(dst->algo_id, src->algo_id, sizeof(src->algo_id));
    }
    for (int t = 0; t < TUNE_NTP; t++)
        for (int l = 0; l < TUNE_NLEVEL; l++) {
            if (src->alpha[t][l] >= 0) dst->alpha[t][l] = src->alpha[t][l];
            if (src->beta[t][l] >= 0) dst->beta[t][l] = src->beta[t][l];
        }
}

typedef struct {
    tune_key_t key;
    int line;
    bool broken;
    tune_entry_t e;
} section_t;

/* Every section of the file, parsed; malformed lines warned about when warn. NULL with errno
 * when the file cannot be read. */
static section_t *parse_file(const char *path, int *nsec, bool warn)
{
    FILE *f = fopen(path, "r");
    if (!f) return NULL;
    section_t *secs = NULL;
    int n = 0, lineno = 0;
    char *buf = NULL;
    size_t cap = 0;
    while (getline(&buf, &cap, f) >= 0) {
        lineno++;
        char *hash = strchr(buf, '#');
        if (hash) *hash = '\0';
        char *s = trim(buf);
        if (!*s) continue;
        const char *why = NULL;
        if (*s == '[') {
            section_t *ns = realloc(secs, sizeof(*secs) * (size_t)(n + 1));
            if (!ns) break;
            secs = ns;
            section_t *c = &secs[n++];
            c->line = lineno;
            tune_entry_clear(&c->e);
            c->broken = parse_header(s, &c->key, &why) != 0;
            if (c->broken && warn)
                WARN(LOG_INIT, "tuning file %s:%d: %s; the section is skipped", path, lineno, why);
            continue;
        }
        if (n == 0) {
            if (warn)
                WARN(LOG_INIT, "tuning file %s:%d: a value before any [section]; skipped", path,
                     lineno);
            continue;
        }
        if (secs[n - 1].broken) continue;
        if (parse_value(s, &secs[n - 1].e, &why) != 0 && warn)
            WARN(LOG_INIT, "tuning file %s:%d: %s; the line is skipped", path, lineno, why);
    }
    free(buf);
    fclose(f);
    *nsec = n;
    if (!secs) secs = calloc(1, sizeof(*secs)); /* an empty file is a file */
    return secs;
}

bool tunefile_read(const char *path, const tune_key_t *key, tune_entry_t *out, bool warn)
{
    tune_entry_clear(out);
    int n = 0;
    section_t *secs = parse_file(path, &n, warn);
    if (!secs) {
        if (warn)
            WARN(LOG_INIT,
                 "tuning file %s: cannot be read (fopen: %s); the built-in defaults apply", path,
                 strerror(errno));
        return false;
    }
    for (int score = 0; score <= 3; score++)
        for (int i = 0; i < n; i++) {
            if (secs[i].broken || key_score(&secs[i].key) != score || !key_fits(&secs[i].key, key))
                continue;
            entry_merge(out, &secs[i].e);
            out->sections++;
            snprintf(out->where, sizeof(out->where), "%s:%d", path, secs[i].line);
        }
    free(secs);
    return true;
}

static void put_field(FILE *f, const char *name, int v, bool first)
{
    if (v < 0)
        fprintf(f, "%s%s=*", first ? "" : " ", name);
    else
        fprintf(f, "%s%s=%d", first ? "" : " ", name, v);
}

void tunefile_write_section(FILE *f, const tune_key_t *key, const tune_entry_t *e)
{
    fputc('[', f);
    put_field(f, "ranks", key->nranks, true);
    if (key->nnodes < 0)
        fprintf(f, " layout=*");
    else
        fprintf(f, " layout=%dx%d", key->nnodes, key->per_node);
    fprintf(f, " mem=%s]\n", key->mem < 0 ? "*" : tune_mem_names[key->mem]);
    if (e->fusion_threshold)
        fprintf(f, "fusion_threshold = %llu\n", (unsigned long long)e->fusion_threshold);
    if (e->fusion_segment)
        fprintf(f, "fusion_segment = %llu\n", (unsigned long long)e->fusion_segment);
    if (e->fusion_cycle_us >= 0) fprintf(f, "fusion_cycle_us = %.17g\n", e->fusion_cycle_us);
    for (int t = 0; t < TUNE_NTP; t++)
        for (int l = 0; l < TUNE_NLEVEL; l++) {
            if (e->alpha[t][l] >= 0)
                fprintf(f, "alpha.%s.%s = %.17g\n", tune_tp_names[t], tune_level_names[l],
                        e->alpha[t][l]);
            if (e->beta[t][l] >= 0)
                fprintf(f, "beta.%s.%s = %.17g\n", tune_tp_names[t], tune_level_names[l],
                        e->beta[t][l]);
        }
    if (e->gamma >= 0) fprintf(f, "gamma = %.17g\n", e->gamma);
    if (e->nalgos > 0) {
        fprintf(f, "allreduce_algos =");
        for (int i = 0; i < e->nalgos; i++) {
            const registry_algo_t *a = registry_get(e->algo_id[i]);
            fprintf(f, " %llu:%s", (unsigned long long)e->algo_from[i], a ? a->name : "?");
        }
        fputc('\n', f);
    }
}

int tunefile_update(const char *path, const tune_key_t *key, const tune_entry_t *e, char *err,
                    size_t errlen)
{
    tune_entry_t merged;
    tune_entry_clear(&merged);
    int n = 0;
    section_t *secs = parse_file(path, &n, false);
    for (int i = 0; secs && i < n; i++)
        if (!secs[i].broken && key_equal(&secs[i].key, key)) entry_merge(&merged, &secs[i].e);
    entry_merge(&merged, e);
    char tmp[4096];
    snprintf(tmp, sizeof(tmp), "%s.tmp%d", path, (int)getpid());
    FILE *out = fopen(tmp, "w");
    if (!out) {
        snprintf(err, errlen, "%s: fopen: %s", tmp, strerror(errno));
        free(secs);
        return -1;
    }
    /* the old text, less the lines of the sections with this key */
    FILE *in = fopen(path, "r");
    if (in) {
        char *buf = NULL;
        size_t cap = 0;
        int lineno = 0, si = -1;
        bool skip = false;
        while (getline(&buf, &cap, in) >= 0) {
            lineno++;
            while (si + 1 < n && secs[si + 1].line == lineno) {
                si++;
                skip = !secs[si].broken && key_equal(&secs[si].key, key);
            }
            if (!skip) fputs(buf, out);
        }
        free(buf);
        fclose(in);
    } else {
        fprintf(out, "# loom tuning file, written by loom-tune; read at init when LOOM_TUNE_FILE "
                     "names it (docs/tuning.md)\n");
    }
    free(secs);
    tunefile_write_section(out, key, &merged);
    if (fclose(out) != 0 || rename(tmp, path) != 0) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        unlink(tmp);
        return -1;
    }
    return 0;
}
