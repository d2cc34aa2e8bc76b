#include "perf_json.h"

#include <math.h>

static void sep(jw_t *w, const char *key)
{
    if (w->depth > 0) {
        if (w->some[w->depth]) fputc(',', w->f);
        w->some[w->depth] = true;
    }
    if (key) {
        fputc('"', w->f);
        for (const unsigned char *p = (const unsigned char *)key; *p; p++) {
            if (*p == '"' || *p == '\\')
                fprintf(w->f, "\\%c", *p);
            else if (*p < 0x20)
                fprintf(w->f, "\\u%04x", *p);
            else
                fputc(*p, w->f);
        }
        fputs("\":", w->f);
    }
}

static void open_c(jw_t *w, const char *key, char c)
{
    sep(w, key);
    fputc(c, w->f);
    if (w->depth + 1 < JW_DEPTH) w->depth++;
    w->some[w->depth] = false;
}

void jw_obj(jw_t *w, const char *key)
{
    open_c(w, key, '{');
}

void jw_list(jw_t *w, const char *key)
{
    open_c(w, key, '[');
}

void jw_end(jw_t *w, char close)
{
    fputc(close, w->f);
    if (w->depth > 0) w->depth--;
}

void jw_str(jw_t *w, const char *key, const char *v)
{
    if (!v) {
        jw_null(w, key);
        return;
    }
    sep(w, key);
    fputc('"', w->f);
    for (const unsigned char *p = (const unsigned char *)v; *p; p++) {
        switch (*p) {
        case '"': fputs("\\\"", w->f); break;
        case '\\': fputs("\\\\", w->f); break;
        case '\n': fputs("\\n", w->f); break;
        case '\t': fputs("\\t", w->f); break;
        default:
            if (*p < 0x20)
                fprintf(w->f, "\\u%04x", *p);
            else
                fputc(*p, w->f);
        }
    }
    fputc('"', w->f);
}

void jw_int(jw_t *w, const char *key, long long v)
{
    sep(w, key);
    fprintf(w->f, "%lld", v);
}

void jw_u64(jw_t *w, const char *key, uint64_t v)
{
    sep(w, key);
    fprintf(w->f, "%llu", (unsigned long long)v);
}

void jw_double(jw_t *w, const char *key, double v)
{
    if (isnan(v)) {
        jw_str(w, key, "nan");
        return;
    }
    if (isinf(v)) {
        jw_str(w, key, v > 0 ? "inf" : "-inf");
        return;
    }
    sep(w, key);
    fprintf(w->f, "%.6f", v);
}

void jw_null(jw_t *w, const char *key)
{
    sep(w, key);
    fputs("null", w->f);
}

void jw_bool_str(jw_t *w, const char *key, bool v)
{
    jw_str(w, key, v ? "true" : "false");
}
